"""`ftrun sbatch` against a real Slurm (scripts/slurm_testbed.sh: munged, slurmctld, 4 slurmd):
the generated script runs a job on its nodes, a node lost inside the allocation (set down by
Slurm, or powered off) is replaced by the spare, a preemption notice becomes a committed
checkpoint, a requeue and a resumed job with the losses of an uninterrupted run, `scancel`
leaves nothing, and a fatal script ends with its exit code and is never requeued.

The preemption notice is sent with `scancel --batch --signal=USR2`, what Slurm's `--signal=B:`
timer does at a time of Slurm's choosing (up to a minute early): the test picks the step.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import BIN, Ftrun, tagged, wait_for
from tests.slurmbed import SlurmBed

TRAIN = str(BIN / "ckpt_train.py")
LOSS = re.compile(r"LOSS rank=(\d+) step=(\d+) loss=(\S+)")


@pytest.fixture
def bed(slurm: SlurmBed) -> SlurmBed:
    """The session's bed, with no job left, every node up and the agents' directories of
    powered-off nodes swept after each test (tests/conftest.py)."""
    return slurm


def submit(ftrun: Ftrun, bed: SlurmBed, *args: str) -> dict[str, Any]:
    result = ftrun.run("sbatch", "--json", *args, env=bed.env, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def events(job: dict[str, Any]) -> list[dict[str, Any]]:
    path = Path(job["job_dir"]) / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def kinds(job: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in events(job) if e["kind"] == kind]


def reached(job: dict[str, Any], step: int) -> bool:
    """Rank 0 printed the loss of `step` (the controller's output, in Slurm's output file)."""
    return f"LOSS rank=0 step={step} " in output(job)


def output(job: dict[str, Any]) -> str:
    return "".join(p.read_text() for p in sorted(Path(job["job_dir"]).glob("slurm-*.out")))


def evidence(job: dict[str, Any], bed: SlurmBed) -> str:
    """What a failure report needs to tell ftrun from Slurm: the agents' logs and the job's
    host events, and the daemons' logs, each cut to its end."""

    def tail(path: Path, lines: int = 25) -> str:
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as e:
            return f"({e})"

    hosts = ("agent", "host", "fault", "generation")
    parts = [json.dumps(e) for e in events(job) if e["kind"].startswith(hosts)]
    for log in sorted(Path(job["job_dir"]).glob("agents/*.log")):
        parts.append(f"--- {log.name}\n{tail(log)}")
    for name in ["slurmctld", *(f"slurmd-{n}" for n in bed.nodes)]:
        parts.append(f"--- {name}.log\n{tail(bed.state_dir / f'{name}.log', 15)}")
    return "\n".join(parts)


def losses(text: str) -> dict[tuple[int, int], str]:
    """(rank, step) → loss; a step run twice (lost, then recomputed) must agree with itself."""
    seen: dict[tuple[int, int], str] = {}
    for rank, step, loss in LOSS.findall(text):
        key = (int(rank), int(step))
        assert seen.setdefault(key, loss) == loss, f"rank {rank} step {step}: two losses"
    return seen


def test_sbatch_runs_a_job_on_three_nodes_to_the_end(ftrun: Ftrun, bed: SlurmBed) -> None:
    job = submit(ftrun, bed, "--nodes", "3", "--", TRAIN, "--steps", "4")
    info = bed.wait_state(job["slurm_job_id"], "COMPLETED", timeout_s=120)
    assert info["ExitCode"] == "0:0"
    (launched,) = kinds(job, "generation_launched")
    assert launched["hosts"] == ["node1", "node2", "node3"]
    (started,) = kinds(job, "job_started")
    assert started["slurm_job_id"] == job["slurm_job_id"]
    assert kinds(job, "job_finished")[-1]["state"] == "succeeded"
    assert sorted(re.findall(r"DONE rank=(\d)", output(job))) == ["0", "1", "2"]
    shown = ftrun.run("status", job["job_id"], "--json", env=bed.env)
    assert json.loads(shown.stdout)["slurm"]["JobState"] == "COMPLETED", shown.stderr


def test_lost_nodes_are_replaced_by_the_spares(ftrun: Ftrun, bed: SlurmBed) -> None:
    """node2 set down by Slurm, then a node of the next generation powered off: each time the
    job goes on, on the allocation's other nodes, and finishes. (node1 runs the batch step, the
    controller: losing it is the controller's death, not a node's, so it is not powered off.)"""
    job = submit(
        ftrun, bed, "--nodes", "2", "--spares", "2", "--", TRAIN, "--steps", "40",
        "--step-time", "0.1",
    )  # fmt: skip
    try:
        lose_two_nodes(job, bed)
    except Exception as e:  # what tells an ftrun fault from a Slurm one, kept with the failure
        raise AssertionError(f"{e}\n{evidence(job, bed)}") from e


def lose_two_nodes(job: dict[str, Any], bed: SlurmBed) -> None:
    wait_for(lambda: reached(job, 5), 120, "step 5")
    bed.set_node_down("node2", "ftrun test")
    wait_for(lambda: len(kinds(job, "first_step")) >= 2, 90, "generation 2's first step")
    second = kinds(job, "generation_launched")[1]["hosts"]
    assert "node2" not in second and len(second) == 2
    victim = next(h for h in second if h != "node1")
    bed.kill_node(victim)
    bed.wait_state(job["slurm_job_id"], "COMPLETED", timeout_s=120)
    bed.start_slurmd(victim)
    faults = kinds(job, "fault_detected")
    assert [(f["fault"], f["host"]) for f in faults] == [
        ("host-lost", "node2"),
        ("host-lost", victim),
    ]
    last = kinds(job, "generation_launched")[-1]["hosts"]
    assert len(last) == 2 and not {"node2", victim} & set(last)
    assert kinds(job, "job_finished")[-1]["state"] == "succeeded"
    assert "DONE rank=0 persisted=40" in output(job)


def agent_sruns(job: dict[str, Any]) -> set[int]:
    """The srun processes (on this machine: the batch node) that run the job's agents."""
    name = f"--job-name=ftrun-agent-{job['job_id']}"
    found = set()
    for proc in psutil.process_iter(["name", "cmdline"]):
        if proc.info["name"] == "srun" and name in (proc.info["cmdline"] or []):
            found.add(proc.pid)
    return found


def test_a_restart_in_place_keeps_every_agents_srun(
    ftrun: Ftrun, bed: SlurmBed, tmp_path: Path
) -> None:
    """A rank crash: every agent stops its generation with a sweep of all it tagged, and starts
    the next. The srun that runs an agent is on the batch node, where that node's agent runs too
    (on this bed, every agent): it must not be taken for one of the agent's processes. It was:
    the sweep killed it, the agent's output was lost from then on, and when Slurm closed its
    stdin the agent fenced, so that a restart in place became a lost host (seen in CI)."""
    marker = tmp_path / "failed-once"
    job = submit(
        ftrun, bed, "--nodes", "2", "--", TRAIN, "--steps", "30", "--step-time", "0.1",
        "--fail-at", "6", "--fail-rank", "1", "--fail-once", str(marker),
    )  # fmt: skip
    wait_for(lambda: len(kinds(job, "agent_connected")) == 2, 60, "both agents")
    sruns = agent_sruns(job)
    assert sruns, "no srun found for the agents"
    wait_for(lambda: len(kinds(job, "first_step")) >= 2, 90, "generation 2's first step")
    assert agent_sruns(job) == sruns, evidence(job, bed)
    bed.wait_state(job["slurm_job_id"], "COMPLETED", timeout_s=120)
    assert [(f["fault"], f["host"]) for f in kinds(job, "fault_detected")] == [("crash", "node2")]
    assert kinds(job, "agent_lost") == [], evidence(job, bed)
    assert kinds(job, "job_finished")[-1]["state"] == "succeeded"


def test_a_preemption_notice_checkpoints_requeues_and_resumes_with_the_same_losses(
    ftrun: Ftrun, bed: SlurmBed, tmp_path: Path
) -> None:
    steps = ["--steps", "24", "--persist-every", "1000"]  # only the notice's save is persisted
    reference = ftrun.run("launch", "--nproc-per-node", "2", TRAIN, *steps, timeout=120)
    assert reference.returncode == 0, reference.stderr
    job = submit(
        ftrun, bed, "--nodes", "2", "--time", "5", "--signal", "USR2@90", "--", TRAIN, *steps,
        "--step-time", "0.1",
    )  # fmt: skip
    wait_for(lambda: reached(job, 8), 120, "step 8")
    bed.run(["scancel", "--batch", "--signal=USR2", job["slurm_job_id"]])
    info = bed.wait_state(job["slurm_job_id"], "COMPLETED", timeout_s=180)
    assert info["Restarts"] == "1"
    (notice,) = kinds(job, "preempt_notice")
    (stopped, finished) = kinds(job, "job_finished")
    assert (stopped["state"], stopped["exit_code"]) == ("requeued", 75)
    assert finished["state"] == "succeeded"
    fault = kinds(job, "fault_detected")[0]
    ended = kinds(job, "generation_ended")[0]
    assert fault["committed_step"] >= notice["step"]
    assert ended["step"] - fault["committed_step"] <= 1, "steps lost to the requeue"
    assert f"RESTORED rank=0 step={fault['committed_step']} tier=storage" in output(job)
    assert [e["gen"] for e in kinds(job, "generation_launched")] == [1, 2]
    assert kinds(job, "resumed")[0]["incident"] == fault["incident"]
    assert losses(output(job)) == losses(reference.stdout + reference.stderr)


def test_scancel_leaves_nothing_on_any_node(ftrun: Ftrun, bed: SlurmBed, test_id: str) -> None:
    job = submit(ftrun, bed, "--nodes", "3", "--", TRAIN, "--steps", "500", "--step-time", "0.1")
    wait_for(lambda: reached(job, 3), 120, "step 3")
    bed.run(["scancel", job["slurm_job_id"]])
    bed.wait_state(job["slurm_job_id"], "CANCELLED", timeout_s=60)
    wait_for(lambda: not _alive(tagged(test_id)), 30, "every process of the job to be gone")
    assert kinds(job, "job_finished")[-1]["state"] == "stopped"


def test_a_fatal_script_exits_1_and_is_never_requeued(ftrun: Ftrun, bed: SlurmBed) -> None:
    job = submit(ftrun, bed, "--nodes", "2", "--requeue", "--", str(BIN / "bad_import.py"))
    info = bed.wait_state(job["slurm_job_id"], "FAILED", timeout_s=120)
    assert (info["ExitCode"], info["Restarts"]) == ("1:0", "0")
    (finished,) = kinds(job, "job_finished")
    assert (finished["state"], finished["exit_code"]) == ("failed", 1)
    assert "no_such_module_for_ftrun_tests" in json.dumps(finished["root_cause"])


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out
