"""Stopping: Ctrl-C and SIGTERM stop everything within the grace period, a second Ctrl-C kills at
once, and a controller killed with SIGKILL leaves agents that fence themselves (at once without a
grace; with one, tests/integration/test_resume.py)."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from tests.conftest import BIN, Output, tagged, wait_for

SLEEPER = str(BIN / "sleeper.py")


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie waiting to be reaped by init."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def rank_pids(pid_dir) -> list[int]:
    return [int(p.read_text()) for p in pid_dir.glob("rank*.pid")]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_everything_gracefully(ftrun, tmp_path, sig):
    proc = ftrun.start("launch", "--nproc-per-node", "2", SLEEPER, "--pid-dir", str(tmp_path))
    out = Output(proc)
    out.wait_for("[rank1]: step 3")
    pids = rank_pids(tmp_path)
    assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
    proc.send_signal(sig)
    assert proc.wait(timeout=20) == 130
    assert "stopped" in out.text()
    assert not any(alive(p) for p in pids)
    job = ftrun.only_job()
    assert job["state"] == "stopped" and job["incidents"] == []


def test_second_ctrl_c_kills_at_once(ftrun, tmp_path):
    proc = ftrun.start(
        "launch", "--grace-period", "60", SLEEPER, "--ignore-sigterm", "--pid-dir", str(tmp_path)
    )
    out = Output(proc)
    out.wait_for("[rank0]: step 3")
    proc.send_signal(signal.SIGINT)
    out.wait_for("again to kill now")
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=15) == 130
    assert time.monotonic() - started < 10, "the second Ctrl-C did not cut the 60 s grace short"
    assert ftrun.only_job()["state"] == "stopped"


def test_without_a_grace_a_killed_controller_makes_the_agent_fence(ftrun, tmp_path, test_id):
    proc = ftrun.start(
        "launch",
        "--controller-grace",
        "0",
        "--nproc-per-node",
        "2",
        SLEEPER,
        "--pid-dir",
        str(tmp_path),
    )
    out = Output(proc)
    out.wait_for("[rank1]: step 3")
    pids = rank_pids(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=5)
    # The agent notices (connection closed, stdin closed) and kills its ranks, then exits.
    wait_for(lambda: not tagged(test_id), 5.0, "the agent and ranks to be gone after fencing")
    assert not any(alive(p) for p in pids)
    job = ftrun.only_job()
    assert job["state"] == "failed" and "controller died" in job["reason"]
    agent_log = (ftrun.run_dir / job["job_id"] / "agents" / "localhost.log").read_text()
    assert "fencing" in agent_log


def test_a_job_ending_beside_another_leaves_it_running(ftrun, tmp_path):
    """Agent ids (host#N) repeat across jobs; each job's teardown sweep must kill only its own
    processes. (Once, a second job's sweep killed the first job's agent: a false host-lost.)"""
    pid_dir = tmp_path / "long"
    pid_dir.mkdir()
    long_job = ftrun.start("launch", "--nproc-per-node", "2", SLEEPER, "--pid-dir", str(pid_dir))
    out = Output(long_job)
    out.wait_for("[rank1]: step 3")
    pids = rank_pids(pid_dir)
    # A second job on the same host that fails and is torn down (restarts, then gives up).
    short = ftrun.run("launch", "--max-restarts", "1", str(BIN / "bad_import.py"), timeout=60)
    assert short.returncode == 1, short.stderr
    last_line = len(out.lines)
    wait_for(
        lambda: any("[rank1]: step" in line for line in out.lines[last_line:]),
        10,
        "a step after the other job's teardown",
    )
    assert all(alive(p) for p in pids), "the other job's teardown killed this job's ranks"
    assert long_job.poll() is None and "lost" not in "".join(out.lines[last_line:])
    long_job.send_signal(signal.SIGINT)
    assert long_job.wait(timeout=20) == 130
