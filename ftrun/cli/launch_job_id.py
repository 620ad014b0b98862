"""Which job `ftrun launch` runs: a new one, the Slurm job's own (so that a requeued batch step
finds its job directory), or the one --job-id names, resumed where it left off.

Refused, with the problem collected into the caller's list for the one message (launch_inputs.py):
a run directory whose path runs into a file, a job id that is not one, a job that ended for good
or whose controller still runs, and a new job whose id another job on this machine runs under.
"""

from __future__ import annotations

from pathlib import Path

from ftrun import jobid
from ftrun.agent import procs
from ftrun.config import new_job_id
from ftrun.errors import UsageError
from ftrun.jobview.fold import controller_alive
from ftrun.journal.read import ResumePoint, check_run_dir_path, read_events
from ftrun.journal.read import resume_point as resume_point_of
from ftrun.transport.slurm_allocation import Allocation


def run_dir_path(run_dir: Path, problems: list[str]) -> bool:
    """False, with the problem, for a run directory whose path runs into a file."""
    try:
        check_run_dir_path(run_dir)
    except UsageError as e:
        problems.append(e.message)
        return False
    return True


def slurm_job_id(run_dir: Path, name: str, allocation: Allocation) -> str:
    """Under Slurm the job id is the Slurm job's (`name-slurm1234`), so that a requeued batch
    step finds its job directory and resumes it; a second `ftrun launch` in one run of a batch
    script (not requeued) is a job of its own."""
    keyed = new_job_id(name, suffix=f"slurm{allocation.key}")
    if allocation.restart_count == 0 and read_events(run_dir / keyed):
        return new_job_id(name)
    return keyed


def resume_point(
    run_dir: Path, job_id: str | None, problems: list[str], *, slurm_restarts: int | None = None
) -> ResumePoint | None:
    """--job-id of a job that ran before (a requeued Slurm job): where it left off; None for a
    new job. A job that finished for good is not run again, nor one whose controller still
    runs. `slurm_restarts`: SLURM_RESTART_COUNT now; a job Slurm itself requeued since its last
    run (preemption by SIGTERM, its batch node lost) resumes even though it ended stopped."""
    if job_id is None:
        return None
    if not jobid.valid(job_id):
        problems.append(f"--job-id {job_id!r} is not a job id ({jobid.WHAT})")
        return None
    try:
        events = read_events(run_dir / job_id)
    except UsageError as e:  # a run dir that is a file was reported already
        if not any(p.startswith("the run directory ") for p in problems):
            problems.append(e.message)
        return None
    if not events:
        _refuse_if_in_use(job_id, problems)
        return None
    point = resume_point_of(events)
    requeued_by_slurm = slurm_restarts is not None and slurm_restarts > point.slurm_restart_count
    if controller_alive(*point.controller):
        problems.append(f"job {job_id} is running (its controller is pid {point.controller[0]})")
    elif not point.resumable and not (requeued_by_slurm and point.finished == "stopped"):
        problems.append(
            f"job {job_id} already ended ({point.finished}): only a preempted job is resumed"
        )
    return point


def _refuse_if_in_use(job_id: str, problems: list[str]) -> None:
    """A new job whose id another job on this machine runs under (launched with another run
    directory, where this one's check cannot see it). Their agents would carry the same process
    tag, so each one's sweep would SIGKILL the other's ranks, and their ranks would write into
    the same memory tier, /dev/shm/ftrun-<job id>."""
    running = procs.job_processes(job_id)
    if running:
        problems.append(
            f"job id {job_id} is in use on this machine by a job with another run directory "
            f"(pid {running[0].pid} is one of its processes): choose another --job-id"
        )
