"""Crash consistency: the saving process SIGKILLed at random moments during saves (a few trials
here; scripts/bench_ckpt.py runs 50+). Every restore must yield one complete step, never a torn
mix, and never go back in time while the memory tier survives."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import ftrun.checkpoint as ckpt
from tests.conftest import BIN


def test_random_sigkills_during_saves_never_yield_a_torn_checkpoint(
    tmp_path, test_id, no_survivors
):
    env = {**os.environ, "FTRUN_TEST_ID": test_id, "PYTHONPATH": str(BIN.parents[1])}
    job = f"crash-{test_id[:12]}"
    try:
        out = subprocess.run(
            [
                sys.executable,
                str(BIN / "ckpt_crash.py"),
                "--trials",
                "5",
                "--state-mib",
                "8",
                "--max-delay-s",
                "0.4",
                "--seed",
                "11",
                "--dir",
                str(tmp_path / "ckpt"),
                "--job",
                job,
            ],
            capture_output=True,
            text=True,
            timeout=100,
            env=env,
        )
    finally:  # ckpt_crash.py removes it too, unless it was killed by the timeout
        shutil.rmtree(ckpt.memory_tier_dir(job), ignore_errors=True)
    records = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    summary = records[-1]
    assert out.returncode == 0 and summary["failures"] == 0, out.stdout[-4000:] + out.stderr[-2000:]
    trials = [r for r in records[:-1] if isinstance(r.get("trial"), int)]
    assert len(trials) == 5 and all(r["complete"] for r in trials)
    assert {r["kill"] for r in trials} - {None}, "no fault was injected"
    final_storage = next(r for r in records if r.get("trial") == "final-storage")
    assert final_storage["complete"] and final_storage["tier"] == "storage"
