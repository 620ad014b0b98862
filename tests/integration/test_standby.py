"""The standby controller (issue 36, items 1 and 2; docs/standby.md), on the ssh testbed: the
job is launched from inside testbed host node1, which then loses power. The standby on node4
(the spare) has a replica of the job directory, streamed to it over the control plane; it takes
the job over and adopts the running generation: the same rank processes, every step once, and
every step's output line written by the primary or the standby: what the ranks printed while
the primary's machine was dark is sent again to the standby (agent/unacked.py). A controller
cut off from the job's hosts instead of killed is fenced by term when it comes back.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Ftrun, wait_for
from tests.integration.ckpt_helpers import recorded_steps
from tests.testbed import Testbed

BIN = Path(__file__).resolve().parent.parent / "bin"
CKPT_TRAIN = str(BIN / "ckpt_train.py")
STEPS = 200  # 10 s at 0.05 s a step: the generation still runs when it is adopted (~5 s)
LOSS = re.compile(r"LOSS rank=(\d+) step=(\d+) ")  # tests/bin/ckpt_train.py's line per step


@pytest.fixture
def bed(testbed: Testbed) -> Testbed:
    return testbed


def events(job_dir: Path) -> list[dict[str, Any]]:
    path = job_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def kinds(job_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in events(job_dir) if e["kind"] == kind]


def agent_logs(job_dir: Path) -> str:
    """What each agent said (to the primary, until it was lost; then into its own file)."""
    logs = [*job_dir.glob("agents/*.log"), *Path("/tmp").glob("ftrun-*agent-*/agent.log")]
    return "\n".join(f"--- {p}\n" + p.read_text()[-1500:] for p in logs)


def printed(*job_dirs: Path) -> dict[int, list[int]]:
    """Each rank's steps whose loss line a controller wrote to the job's logs, in any of these
    job directories (the primary's, the standby's replica), each step as often as written."""
    steps: dict[int, list[int]] = {}
    for path in sorted(p for d in job_dirs for p in d.glob("logs/g*/rank*.log")):
        for rank, step in LOSS.findall(path.read_text(errors="replace")):
            steps.setdefault(int(rank), []).append(int(step))
    return steps


def missing_lines(steps: int, *job_dirs: Path) -> dict[int, list[int]]:
    """The (rank, step) loss lines no controller wrote: none, once output survives a loss."""
    got = printed(*job_dirs)
    lost = {r: sorted(set(range(1, steps + 1)) - set(got.get(r, []))) for r in (0, 1)}
    return {r: s for r, s in lost.items() if s}


def launch_on_node1(
    ftrun: Ftrun, bed: Testbed, record: Path, standby: tuple[str, ...] = ("--standby", "node4")
) -> subprocess.Popen[str]:
    """`ftrun launch` typed on testbed host node1: the controller runs in its namespace.
    `standby`: the flags that choose it (none: the default, the spare)."""
    argv = [sys.executable, "-m", "ftrun", "launch", "--ssh-config", str(bed.ssh_config)]
    argv += ["--hosts", "node2,node3", "--spares", "node4", *standby]
    argv += [CKPT_TRAIN, "--steps", str(STEPS), "--step-time", "0.05", "--record", str(record)]
    return subprocess.Popen(
        ["ip", "netns", "exec", bed.host("node1").namespace, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=ftrun.env,
        start_new_session=True,
    )


def training_with_a_standby(ftrun: Ftrun, record: Path) -> tuple[Path, Path, dict[int, int]]:
    """Once the standby is ready and the ranks are past step 10: the job's directory, the
    standby's replica of it, and each rank's pid."""
    wait_for(lambda: list(ftrun.run_dir.glob("*/events.jsonl")), 60, "the job's journal")
    job_dir = next(ftrun.run_dir.glob("*/events.jsonl")).parent
    replica = ftrun.run_dir / ".standby" / "node4" / job_dir.name
    wait_for(lambda: kinds(job_dir, "standby_ready"), 60, "the standby")
    wait_for(lambda: len(recorded_steps(record, 1)) >= 10, 120, "step 10")
    return job_dir, replica, {e["rank"]: e["pid"] for e in kinds(job_dir, "rank_started")}


def test_the_controllers_machine_loses_power_and_the_standby_adopts_the_ranks(
    ftrun: Ftrun, bed: Testbed, tmp_path: Path
) -> None:
    record = tmp_path / "record"
    record.mkdir()
    proc = launch_on_node1(ftrun, bed, record)
    try:
        job_dir, replica, ranks = training_with_a_standby(ftrun, record)
        # The replica has what the primary journaled: it follows line by line.
        wait_for(
            lambda: kinds(replica, "rank_started") == kinds(job_dir, "rank_started"),
            10,
            "the ranks' start in the replica",
        )
        bed.kill("node1")  # the controller's machine: link down, then every process in it
        killed_t = time.time()
        print(f"killed node1 at {killed_t:.3f}")
        proc.wait(timeout=10)
        wait_for(
            lambda: kinds(replica, "adopted"),
            60,
            lambda: (replica / "takeover.log").read_text()[-3000:] + agent_logs(job_dir),
        )
        wait_for(
            lambda: kinds(replica, "job_finished"),
            120,
            lambda: (replica / "takeover.log").read_text()[-3000:],
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    takeover = (replica / "takeover.log").read_text()
    (finished,) = kinds(replica, "job_finished")
    assert finished["state"] == "succeeded", takeover[-3000:]
    (adopted,) = kinds(replica, "adopted")
    assert adopted["gen"] == 1 and adopted["hosts"] == ["node2", "node3"]
    assert [e["gen"] for e in kinds(replica, "generation_launched")] == [1]
    assert {e["rank"]: e["pid"] for e in kinds(replica, "rank_started")} == ranks
    assert [e["run"] for e in kinds(replica, "job_started")] == [1, 2]  # the term
    for rank in (0, 1):  # every step once, none lost, none done twice
        done = [s for s, _ in recorded_steps(record, rank)]
        assert done == list(range(1, STEPS + 1)), done[-5:]
    shown = ftrun.run("inspect", job_dir.name, "--run-dir", str(replica.parent), "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["controller"]["term"] == 2  # the standby's
    (incident,) = json.loads(shown.stdout)["incidents"]
    assert incident["kind"] == "controller-lost"
    print(f"killed at {killed_t:.3f}; phases {incident['phases']}")
    # Every step's line reached a controller: what went into the dead primary's socket, and
    # what was said while no controller listened, was sent again to the standby.
    assert not missing_lines(STEPS, job_dir, replica), missing_lines(STEPS, job_dir, replica)
    twice = {r: len(s) - len(set(s)) for r, s in printed(job_dir, replica).items()}
    print(f"lines written twice (by the primary, then again by the standby): {twice}")


def test_a_cut_off_primary_that_comes_back_is_fenced_by_term(
    ftrun: Ftrun, bed: Testbed, tmp_path: Path
) -> None:
    """node1, where the primary runs, is cut off (alive, unreachable): the standby takes over
    with term 2. Healed, the primary finds the job's hosts again and acts on what it saw: its
    `fence` on the agents' stdin, its sweeps and its new agents are refused by term on every
    host, and it stops. The ranks it lost train on under the standby: every step once."""
    record = tmp_path / "record"
    record.mkdir()
    proc = launch_on_node1(ftrun, bed, record)
    try:
        job_dir, replica, ranks = training_with_a_standby(ftrun, record)
        bed.cut("node1")
        wait_for(
            lambda: kinds(replica, "adopted"),
            60,
            lambda: (replica / "takeover.log").read_text()[-3000:] + agent_logs(job_dir),
        )
        bed.heal("node1")
        primary_out, _ = proc.communicate(timeout=150)
        wait_for(lambda: kinds(replica, "job_finished"), 120, "the standby's end of the job")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    (finished,) = kinds(replica, "job_finished")
    assert finished["state"] == "succeeded", (replica / "takeover.log").read_text()[-3000:]
    assert {e["rank"]: e["pid"] for e in kinds(replica, "rank_started")} == ranks
    for rank in (0, 1):  # every step once: nothing the primary did after the heal reached them
        done = [s for s, _ in recorded_steps(record, rank)]
        assert done == list(range(1, STEPS + 1)), done[-5:]
    # What the primary did after the heal was refused by term, not merely unreachable.
    log = (job_dir / "controller.log").read_text()
    refused = log.count("not swept: a controller newer than term 1 leads the job")
    assert refused or kinds(job_dir, "superseded"), log[-3000:]
