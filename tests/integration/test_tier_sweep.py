"""An agent sweeps the memory tiers that agents killed without their cleanup left behind
(the OOM killer, SIGKILL): before, nothing ever removed them from /dev/shm."""

from __future__ import annotations

import os
import shutil
import subprocess

import psutil

from ftrun.agent import workdir
from tests.conftest import BIN

MARK = ".agent-"  # ftrun/agent/tiers.py: MARK_PREFIX (spelled out: the test also runs without it)


def test_launch_sweeps_a_tier_whose_agent_was_killed(ftrun, test_id):
    dead = subprocess.Popen(["sleep", "30"])
    start = int(psutil.Process(dead.pid).create_time() * 1000)
    dead.kill()
    dead.wait(timeout=10)
    orphan = workdir.SHM / f"ftrun-{os.geteuid()}" / f"orphan-{test_id[:12]}"
    try:
        (orphan / "rank0").mkdir(parents=True, mode=0o700)
        os.chmod(orphan.parent, 0o700)
        (orphan / "rank0" / "slot0.data").write_bytes(b"\0" * 65536)
        (orphan / f"{MARK}{dead.pid}-{start}").touch()
        result = ftrun.run(
            "launch", "--nproc-per-node", "1", str(BIN / "train_toy.py"), "--steps", "1"
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert not orphan.exists()
        job = ftrun.only_job()
        assert not (orphan.parent / job["job_id"]).exists()  # its own, at its end
    finally:
        shutil.rmtree(orphan, ignore_errors=True)
