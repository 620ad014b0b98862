"""No false alarms: a local agent that is alive but silent (stopped, starved) is slow, not lost,
and the job goes on; one that really died is still lost within the target."""

from __future__ import annotations

import os
import signal
import time

from tests.conftest import BIN, Output, wait_for

TOY = str(BIN / "train_toy.py")
CKPT_TRAIN = str(BIN / "ckpt_train.py")
# Short timeouts so that the stop below outlasts both the lost and the fence timeout quickly.
TIMEOUTS = ["--heartbeat-interval", "0.1", "--host-lost-timeout", "0.5", "--fence-timeout", "1"]


def job_events(ftrun):
    jobs = wait_for(lambda: list(ftrun.run_dir.glob("*/events.jsonl")), 30, "the job's journal")
    return lambda: ftrun.events(jobs[0].parent.name)


def agent_pid(events) -> int:
    return wait_for(
        lambda: next((e["pid"] for e in events() if e["kind"] == "agent_connected"), None),
        30,
        "the agent to connect",
    )


def test_a_stopped_local_agent_is_slow_not_lost_and_the_job_finishes(ftrun):
    proc = ftrun.start(
        "launch", "--nproc-per-node", "2", *TIMEOUTS, TOY, "--steps", "120", "--step-time", "0.03"
    )
    out = Output(proc)
    out.wait_for("[rank1]: STEP 10 ")
    events = job_events(ftrun)
    pid = agent_pid(events)
    os.kill(pid, signal.SIGSTOP)
    try:
        slow = wait_for(
            lambda: [e for e in events() if e["kind"] == "agent_slow"],
            10,
            "agent_slow in the journal",
        )
        # Hold it past the fence timeout too: on SIGCONT it must read the controller's waiting
        # heartbeats before judging the silence (and a local agent does not fence on it).
        wait_for(lambda: time.time() > slow[0]["t"] + 1.0, 5, "the fence timeout to pass")
    finally:
        os.kill(pid, signal.SIGCONT)
    assert proc.wait(timeout=90) == 0, out.text()
    evs = events()
    kinds = [e["kind"] for e in evs]
    assert "agent_recovered" in kinds and "fault_detected" not in kinds, kinds
    [recovered] = [e for e in evs if e["kind"] == "agent_recovered"]
    assert recovered["silent_s"] > 1.0
    job = ftrun.only_job()
    assert job["state"] == "succeeded" and job["incidents"] == []
    agent_log = (ftrun.run_dir / job["job_id"] / "agents" / "localhost.log").read_text()
    assert "fencing" not in agent_log
    assert any(e["kind"] == "heartbeat_stats" for e in evs)


def test_a_stopped_agent_that_is_then_killed_is_lost_fast(ftrun):
    proc = ftrun.start("launch", "--nproc-per-node", "2", *TIMEOUTS, str(BIN / "sleeper.py"))
    out = Output(proc)
    out.wait_for("[rank1]: step 3")
    events = job_events(ftrun)
    pid = agent_pid(events)
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: any(e["kind"] == "agent_slow" for e in events()), 10, "agent_slow")
    killed = time.time()
    os.kill(pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == 1, out.text()
    [detected] = [e for e in events() if e["kind"] == "fault_detected"]
    assert detected["fault"] == "host-lost" and detected["t"] - killed <= 1.5


def test_the_last_persist_after_fast_steps_is_not_a_hang(ftrun):
    """Steps of milliseconds leave the 2 s floor as the hang allowance; the persist of the last
    snapshot in close() takes longer (12 MB at 3 MB/s) and declares itself a section, so the
    job ends with it instead of being restarted as hung (as it was on a GPU, with 0.3 s steps)."""
    proc = ftrun.start(
        "launch", "--nproc-per-node", "1", CKPT_TRAIN, "--steps", "20", "--width", "1024",
        "--persist-every", "1000", "--persist-bandwidth", "3",
    )  # fmt: skip
    out = Output(proc)
    out.wait_for("LOSS rank=0 step=20 ", timeout_s=90)
    last_step = time.monotonic()
    assert proc.wait(timeout=120) == 0, out.text()
    assert time.monotonic() - last_step > 3.0, "the close was shorter than the hang allowance"
    job = ftrun.only_job()
    assert job["state"] == "succeeded" and job["incidents"] == [], out.text()
    assert "DONE rank=0 persisted=20" in out.text()
