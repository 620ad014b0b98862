"""The Slurm testbed (scripts/slurm_testbed.sh) is a real cluster: a batch job's steps run on
three distinct nodes, `srun --overlap` joins a running allocation, a node set down stays down
until resumed, a requeued job runs again with SLURM_RESTART_COUNT=1, a power loss kills one
node's tasks only, and `down` leaves no daemon, step or task. Each test cancels its jobs and
restores its nodes, so the tests do not depend on their order."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import wait_for
from tests.slurmbed import SlurmBed, free_port_block, unavailable_reason

# Every test here needs the Slurm testbed, also the one that brings up its own bed without the
# fixture (the `slurm` fixture alone would mark only the others).
pytestmark = pytest.mark.testbed


@pytest.fixture
def bed(slurm: SlurmBed) -> SlurmBed:
    """The session's bed, left with no job and every node up after the test (tests/conftest.py)."""
    return slurm


def job_script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/bash\nset -eu\n" + body)
    return path


def live(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def steps_of(bed: SlurmBed) -> list[int]:
    """The bed's slurmstepd processes: slurmd starts them in its working directory, the state dir."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.cmdline()[:1] and proc.cmdline()[0].startswith("slurmstepd"):
                if proc.cwd() == str(bed.state_dir) and live(proc.pid):
                    found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def read_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_batch_job_runs_a_step_on_each_of_three_nodes(bed: SlurmBed, tmp_path: Path):
    out = tmp_path / "nodes.txt"
    script = job_script(
        tmp_path / "job.sh",
        f'echo "batch $SLURMD_NODENAME $SLURM_JOB_NUM_NODES" >> {out}\n'
        f"srun bash -c 'echo \"step $SLURMD_NODENAME $SLURM_PROCID\" >> {out}'\n",
    )
    job = bed.submit(script, "-N", "3", "-o", str(tmp_path / "slurm-%j.out"))
    info = bed.wait_state(job, "COMPLETED", timeout_s=30)
    assert info["NodeList"] == "node[1-3]"
    lines = read_lines(out)
    assert lines[0] == "batch node1 3"
    assert sorted(lines[1:]) == ["step node1 0", "step node2 1", "step node3 2"]
    assert bed.job_state(job) == "COMPLETED"  # still known after the end (MinJobAge)


def test_srun_overlap_joins_a_running_allocation(bed: SlurmBed, tmp_path: Path):
    script = job_script(tmp_path / "hold.sh", "srun sleep 300\n")
    job = bed.submit(script, "-N", "4", "-o", str(tmp_path / "slurm-%j.out"))
    bed.wait_state(job, "RUNNING", timeout_s=30)
    step = ["srun", f"--jobid={job}", "--overlap", "-w", "node2", "-N1", "-n1"]
    r = bed.run([*step, "bash", "-c", "echo $SLURMD_NODENAME $SLURM_JOB_ID"], timeout=30)
    assert r.stdout.split() == ["node2", job]
    # srun forwards its stdin to task 0
    assert bed.run([*step, "cat"], timeout=30, input="through srun\n").stdout == "through srun\n"
    assert bed.job_state(job) == "RUNNING"


def test_node_set_down_stays_down_until_resumed(bed: SlurmBed):
    bed.set_node_down("node2", "fault injected by test_slurmbed")
    assert "DOWN" in bed.node_state("node2")
    assert bed.node_info("node2")["Reason"].startswith("fault injected by test_slurmbed")
    time.sleep(1)  # ReturnToService=1: slurmd still answers, yet the node does not come back
    assert "DOWN" in bed.node_state("node2")
    assert bed.node_state("node1") == "IDLE"
    bed.resume_node("node2")
    assert bed.node_state("node2") == "IDLE"


def test_requeue_runs_the_job_again_with_restart_count(bed: SlurmBed, tmp_path: Path):
    out = tmp_path / "restarts.txt"
    script = job_script(
        tmp_path / "job.sh", f'echo "restart=${{SLURM_RESTART_COUNT:-none}}" >> {out}\nsleep 300\n'
    )
    job = bed.submit(script, "-N", "2", "--requeue", "-o", str(tmp_path / "slurm-%j.out"))
    bed.wait_state(job, "RUNNING", timeout_s=30)
    wait_for(lambda: read_lines(out) == ["restart=none"], 10, f"the first run's line in {out}")
    bed.run(["scontrol", "requeue", job])
    # Slurm holds a requeued job back for cred_expire (5 s here) before it starts again.
    info = bed.wait_state(job, "RUNNING", timeout_s=30)
    assert info["Restarts"] == "1"
    wait_for(
        lambda: read_lines(out) == ["restart=none", "restart=1"], 10, f"the second run in {out}"
    )


def test_kill_node_is_a_power_loss_of_that_node_only(bed: SlurmBed, tmp_path: Path):
    pids = tmp_path / "pids"
    pids.mkdir()
    script = job_script(
        tmp_path / "hold.sh", f"srun bash -c 'echo $$ > {pids}/$SLURMD_NODENAME; exec sleep 300'\n"
    )
    job = bed.submit(script, "-N", "3", "--no-requeue", "-o", str(tmp_path / "slurm-%j.out"))
    bed.wait_state(job, "RUNNING", timeout_s=30)
    wait_for(lambda: len(list(pids.iterdir())) == 3, 10, "a task on each of 3 nodes")
    task = {p.name: int(p.read_text()) for p in pids.iterdir()}
    slurmd = bed.daemon_pids()["slurmd-node3"]
    bed.kill_node("node3")
    assert not live(task["node3"]) and not live(slurmd)
    assert live(task["node1"]) and live(task["node2"])
    assert bed.job_state(job) == "RUNNING"  # until slurmctld misses node3 (SlurmdTimeout)
    bed.start_slurmd("node3")
    assert "NOT_RESPONDING" not in bed.node_state("node3")


def test_down_stops_every_daemon_step_and_task(tmp_path: Path):
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    base = free_port_block(3, start=51000)
    with SlurmBed(2, state_dir=tmp_path / "own", ctld_port=base, slurmd_port=base + 1) as own:
        first = own.daemon_pids()
        own.up()  # up on a bed that is up takes the old one down first
        assert not any(live(p) for p in first.values()), first
        daemons = own.daemon_pids()
        assert sorted(daemons) == ["munged", "slurmctld", "slurmd-node1", "slurmd-node2"]
        out = tmp_path / "task.pid"
        script = job_script(
            tmp_path / "hold.sh", f"srun -n1 bash -c 'echo $$ > {out}; exec sleep 300'\n"
        )
        job = own.submit(script, "-N", "2", "-o", str(tmp_path / "slurm-%j.out"))
        own.wait_state(job, "RUNNING", timeout_s=30)
        wait_for(out.exists, 10, "the task's pid file")
        task = int(out.read_text())
        steps = steps_of(own)
        assert steps and live(task)
    left = [p for p in [*daemons.values(), *steps, task] if live(p)]
    assert not left, f"alive after down: {left}"
    assert not own.state_dir.exists()
    own.down()  # idempotent
    assert os.path.isdir(tmp_path)
