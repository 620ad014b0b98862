"""The standby by default (issue 36; docs/standby.md), on the ssh testbed, the job launched from
inside testbed host node1 with no --standby: the first spare keeps the standby.

A standby that is on by default must not take a job over from a controller that is only slow:
a primary stopped (^Z, a starved machine) for twice --fence-timeout keeps its job, because the
agents see its machine still acknowledge what they send. And a resume by hand after a real
takeover is refused with a pointer to where the job runs, instead of competing with it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import Ftrun, wait_for
from tests.integration.ckpt_helpers import recorded_steps
from tests.integration.test_standby import STEPS, agent_logs, kinds, training_with_a_standby
from tests.integration.test_standby import launch_on_node1 as launch_standby_on_node1
from tests.testbed import Testbed

STOPPED_S = 6.0  # twice --fence-timeout


def launch_on_node1(ftrun: Ftrun, bed: Testbed, record: Path) -> subprocess.Popen[str]:
    """`ftrun launch` typed on testbed host node1, with a spare and no --standby."""
    return launch_standby_on_node1(ftrun, bed, record, standby=())


def test_a_stopped_primary_keeps_its_job_the_standby_does_not_take_it(
    ftrun: Ftrun, testbed: Testbed, tmp_path: Path
) -> None:
    record = tmp_path / "record"
    record.mkdir()
    proc = launch_on_node1(ftrun, testbed, record)
    try:
        job_dir, replica, ranks = training_with_a_standby(ftrun, record)
        assert [e["host"] for e in kinds(job_dir, "standby_ready")] == ["node4"]  # the default
        os.kill(proc.pid, signal.SIGSTOP)  # the controller: silent, its machine up
        time.sleep(STOPPED_S)  # the fault itself: how long the controller stays stopped
        os.kill(proc.pid, signal.SIGCONT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait(timeout=10)
    said = agent_logs(job_dir) + (job_dir / "controller.log").read_text()[-3000:]
    assert proc.returncode == 0, out[-3000:] + said
    assert not (replica / "takeover.log").exists(), (replica / "takeover.log").read_text()[-3000:]
    (finished,) = kinds(job_dir, "job_finished")
    assert finished["state"] == "succeeded"
    assert [e["run"] for e in kinds(job_dir, "job_started")] == [1]
    assert {e["rank"]: e["pid"] for e in kinds(job_dir, "rank_started")} == ranks
    for rank in (0, 1):  # every step once, under the one controller
        done = [s for s, _ in recorded_steps(record, rank)]
        assert done == list(range(1, STEPS + 1)), done[-5:]
    assert "it is slow or stopped, not gone" in said, said


def test_a_resume_by_hand_after_a_takeover_points_to_the_standby(
    ftrun: Ftrun, testbed: Testbed, tmp_path: Path
) -> None:
    """The primary process is killed (its machine lives): the standby takes over at once (the
    connection closed). `ftrun resume` typed on node1 then says where the job runs and starts
    nothing; the job finishes under the standby."""
    record = tmp_path / "record"
    record.mkdir()
    proc = launch_on_node1(ftrun, testbed, record)
    try:
        job_dir, replica, _ = training_with_a_standby(ftrun, record)
        proc.kill()
        proc.wait(timeout=10)
        wait_for(lambda: kinds(replica, "adopted"), 60, lambda: agent_logs(job_dir))
        by_hand = subprocess.run(
            ["ip", "netns", "exec", testbed.host("node1").namespace, sys.executable, "-m"]
            + ["ftrun", "resume", job_dir.name, "--run-dir", str(ftrun.run_dir)],
            capture_output=True,
            text=True,
            env=ftrun.env,
            timeout=60,
        )
        wait_for(lambda: kinds(replica, "job_finished"), 120, "the standby's end of the job")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert by_hand.returncode != 0, by_hand.stdout[-2000:] + by_hand.stderr[-2000:]
    assert "was taken over by its standby controller on node4" in by_hand.stderr, by_hand.stderr
    assert "Traceback" not in by_hand.stderr
    assert [e["run"] for e in kinds(job_dir, "job_started")] == [1]  # nothing started by hand
    (finished,) = kinds(replica, "job_finished")
    assert finished["state"] == "succeeded", (replica / "takeover.log").read_text()[-3000:]
    for rank in (0, 1):
        done = [s for s, _ in recorded_steps(record, rank)]
        assert done == list(range(1, STEPS + 1)), done[-5:]
    # inspect on the replica: the outage's phases, the agents' verdict before the takeover.
    shown = ftrun.run("inspect", job_dir.name, "--run-dir", str(replica.parent), "--json")
    (incident,) = json.loads(shown.stdout)["incidents"]
    phases = incident["phases"]
    assert incident["kind"] == "controller-lost" and "torn down" not in phases, incident
    assert phases["detected"] <= phases["taken over"] <= phases["relaunched"], phases
    assert phases["relaunched"] <= phases["first step again"], phases
    print("phases after the kill:", {k: round(v - phases["fault"], 3) for k, v in phases.items()})
