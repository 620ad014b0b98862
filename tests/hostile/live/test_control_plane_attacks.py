"""Live attacks on a running job's control plane (scripts/attacks.py): strangers without the
secret, and secret holders posing as an agent, as the controller, or replaying frames. Every
attack must be refused, the job must go on to a clean finish, the refusals must be in its
journal, and nothing may be written outside the job's directory."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import psutil

from tests.conftest import BIN, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
import attacks


def stepping(ftrun) -> tuple[Path, Path]:
    """The job's directory and rank 0's log, once rank 0 has printed step 3."""
    job_dir = wait_for(
        lambda: next((d for d in ftrun.run_dir.glob("*/control.json")), None), 30, "the job"
    ).parent
    rank_log = job_dir / "logs" / "g1" / "rank0.log"
    wait_for(lambda: rank_log.exists() and "step 3" in rank_log.read_text(), 60, "step 3")
    return job_dir, rank_log


def reap(proc) -> None:
    """The launcher, killed if a failed assertion left it running."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=20)


def succeeded(proc, out: str, job_dir: Path) -> list[dict]:
    """The job's events, once it is known to have ended well: exit 0, journal closed."""
    assert proc.returncode == 0, out[-3000:]
    events = attacks.events(job_dir)
    assert events[-1]["kind"] == "job_finished" and events[-1]["state"] == "succeeded"
    return events


def open_fds(pid: int) -> int:
    return psutil.Process(pid).num_fds()


def test_every_attack_is_refused_and_the_job_finishes(ftrun, tmp_path):
    started = time.time()
    # 500 steps (25 s) bound the job on a slow day; the stop file ends it once the attacks are
    # done and it was seen running after them.
    stop = tmp_path / "stop"
    proc = ftrun.start("launch", str(BIN / "plain_loop.py"), "--steps", "500", "--interval",
                       "0.05", "--stop-file", str(stop))  # fmt: skip
    try:
        job_dir, _ = stepping(ftrun)
        controller = psutil.Process(proc.pid)
        fds_before = open_fds(controller.pid)
        target = attacks.Target.of_job(job_dir)
        outcomes = asyncio.run(attacks.run_all(target))
        for outcome in outcomes:
            assert outcome.refused, outcome
        # The flood's sockets are all gone again: nothing held for strangers.
        wait_for(lambda: open_fds(controller.pid) <= fds_before + 2, 10, "the controller's fds")
        assert ftrun.status_json(job_dir.name)["state"] == "running"
        stop.write_text("")
        out, _ = proc.communicate(timeout=90)
    finally:
        reap(proc)
    events = succeeded(proc, out, job_dir)
    assert sum(e["kind"] == "generation_launched" for e in events) == 1  # no restart was forced
    refused = [e for e in events if e["kind"] == "message_refused"]
    assert {e["message_kind"] for e in refused} >= {None}  # the reflected frame: no body
    assert any(e["kind"] == "connection_refused" for e in events)
    # `status` and `inspect` count what was turned away: every flood connection, every message.
    turned = ftrun.status_json(job_dir.name)["turned_away"]
    assert turned["connections refused"] >= 600 and turned["messages refused"] >= 6, turned
    inspect = ftrun.run("inspect", job_dir.name, timeout=30)
    assert "turned away:" in inspect.stdout and "connections refused" in inspect.stdout
    assert [p.name for p in ftrun.run_dir.iterdir()] == [job_dir.name]
    assert attacks.written_outside(tmp_path, job_dir, started) == 0


def test_a_flood_past_the_descriptor_limit_does_not_take_the_controller_down(ftrun, tmp_path):
    """The controller and its agent under a 64-descriptor limit, and 300 connections at once:
    accept() fails with EMFILE for most of them. The job must go on and its journal must end."""
    import resource
    import subprocess

    def low_fd_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    proc = subprocess.Popen(
        [sys.executable, "-m", "ftrun", "launch", str(BIN / "plain_loop.py"), "--steps", "150"]
        + ["--interval", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=ftrun.env,
        start_new_session=True,
        preexec_fn=low_fd_limit,
    )
    try:
        job_dir, rank_log = stepping(ftrun)
        outcome = asyncio.run(attacks.flood(attacks.Target.of_job(job_dir), connections=300))
        assert outcome.refused, outcome
        out, _ = proc.communicate(timeout=90)
    finally:
        reap(proc)
    succeeded(proc, out, job_dir)
    assert "step 150" in rank_log.read_text()
