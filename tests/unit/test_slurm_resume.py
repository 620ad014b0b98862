"""Under Slurm: which nodes train and which wait, what names a job across requeues, and where a
requeued job's journal says it left off. Pure: allocations and journals built here."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ftrun.cli.launch_job_id import slurm_job_id
from ftrun.errors import UsageError
from ftrun.journal.read import resume_point
from ftrun.transport.slurm_allocation import Allocation


def test_spares_are_the_last_nodes_of_the_allocation() -> None:
    alloc = Allocation(job_id="7", nodes=("n1", "n2", "n3", "n4"))
    assert alloc.split(1) == (("n1", "n2", "n3"), ("n4",))
    assert alloc.split(0) == (("n1", "n2", "n3", "n4"), ())
    with pytest.raises(UsageError, match="leaves no node to train on"):
        alloc.split(4)


def test_an_array_task_is_named_by_its_own_id() -> None:
    assert Allocation(job_id="9", nodes=("n1",)).key == "9"
    task = Allocation(job_id="12", nodes=("n1",), array_job_id="10", array_task_id="2")
    assert task.key == "10_2"


def _journal(job_dir: Path, *events: dict) -> None:
    job_dir.mkdir(parents=True)
    (job_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def test_the_job_id_is_the_slurm_job_s_and_a_second_launch_in_one_run_is_its_own(
    tmp_path: Path,
) -> None:
    first = Allocation(job_id="41", nodes=("n1",))
    assert slurm_job_id(tmp_path, "train", first) == "train-slurm41"
    _journal(tmp_path / "train-slurm41", {"kind": "job_started"})
    again = slurm_job_id(tmp_path, "train", first)  # the same batch script launches twice
    assert again.startswith("train-") and again != "train-slurm41"
    requeued = Allocation(job_id="41", nodes=("n2",), restart_count=1)
    assert slurm_job_id(tmp_path, "train", requeued) == "train-slurm41"


def test_a_requeued_job_goes_on_numbering_where_its_journal_left_off() -> None:
    point = resume_point(
        [
            {"kind": "job_started"},
            {"kind": "generation_launched", "gen": 1},
            {"kind": "fault_detected", "incident": 1},
            {"kind": "restart", "incident": 1},
            {"kind": "generation_launched", "gen": 2},
            {"kind": "fault_detected", "incident": 2, "fault": "preempted"},
            {"kind": "job_finished", "state": "requeued"},
        ]
    )
    assert (point.generation, point.incidents, point.restarts) == (2, 2, 1)
    assert (point.open_incident, point.runs, point.resumable) == (2, 1, True)
    for state in ("succeeded", "failed", "stopped"):
        assert not resume_point([{"kind": "job_finished", "state": state}]).resumable
    assert resume_point([{"kind": "job_started"}]).resumable  # its controller died


def test_a_job_slurm_requeued_itself_resumes_even_though_it_ended_stopped(tmp_path: Path) -> None:
    """Slurm's own requeue (preemption by SIGTERM, its batch node lost) stops the controller
    with no notice: the next run, with a higher SLURM_RESTART_COUNT, resumes. A job stopped by
    hand (the same restart count) or one whose controller still runs does not."""
    from ftrun.cli.launch_job_id import resume_point as check

    _journal(
        tmp_path / "j",
        {"kind": "job_started", "slurm_restart_count": 0, "controller_pid": None},
        {"kind": "generation_launched", "gen": 1},
        {"kind": "job_finished", "state": "stopped"},
    )
    problems: list[str] = []
    point = check(tmp_path, "j", problems, slurm_restarts=1)
    assert problems == [] and point is not None and point.generation == 1
    check(tmp_path, "j", problems, slurm_restarts=0)
    assert problems == ["job j already ended (stopped): only a preempted job is resumed"]
    _journal(
        tmp_path / "live",
        {"kind": "job_started", "controller_pid": os.getpid(), "controller_create_time": None},
    )
    problems = []
    check(tmp_path, "live", problems)
    assert problems and "is running" in problems[0]
