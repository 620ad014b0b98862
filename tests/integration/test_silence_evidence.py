"""A silent agent over ssh is lost only with evidence (docs/timeouts.md): its host's agent is
stopped (SIGSTOP) for three times --host-lost-timeout while its machine runs. Its machine's kernel
still acknowledges the controller's heartbeats, so the agent is slow, not lost: no incident, no
restart, the same ranks to the end. Before, the silence alone lost the host and restarted the job.
A host cut off from the network (no acknowledgements) is still lost at the timeout: see
test_multihost's partition test and test_standby's power loss."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil

from tests.conftest import Ftrun, Output
from tests.testbed import Testbed

CKPT_TRAIN = str(Path(__file__).resolve().parent.parent / "bin" / "ckpt_train.py")
STOPPED_S = 3.0  # three times the default --host-lost-timeout


def agent_pid(bed: Testbed, host: str) -> int:
    for pid in bed.pids(host):
        try:
            if "ftrun.agent" in psutil.Process(pid).cmdline():
                return pid
        except psutil.Error:
            continue
    raise AssertionError(f"no agent on {host}")


def test_a_stopped_agent_whose_machine_answers_is_slow_not_lost(
    ftrun: Ftrun, testbed: Testbed
) -> None:
    proc = ftrun.start(
        "launch", "--ssh-config", str(testbed.ssh_config), "--hosts", "node1,node2",
        "--no-standby", CKPT_TRAIN, "--steps", "80", "--step-time", "0.05",
    )  # fmt: skip
    out = Output(proc)
    try:
        out.wait_for("[rank0]: LOSS rank=0 step=10 ", 120)
        pid = agent_pid(testbed, "node1")
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(STOPPED_S)  # the fault itself: how long the agent stays stopped
        finally:
            os.kill(pid, signal.SIGCONT)
        assert proc.wait(timeout=120) == 0, out.text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    events = ftrun.events(ftrun.job_id())
    kinds = [e["kind"] for e in events]
    assert "fault_detected" not in kinds, [e for e in events if e["kind"] == "fault_detected"]
    assert kinds.count("generation_launched") == 1
    slow = [e for e in events if e["kind"] == "agent_slow"]
    assert [e["host"] for e in slow] == ["node1"] and slow[0]["silent_s"] > 1.0, slow
    assert [e["host"] for e in events if e["kind"] == "agent_recovered"] == ["node1"]
