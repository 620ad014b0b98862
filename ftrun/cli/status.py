"""`ftrun status [JOB]`: what is running and what ran. Reads only job directories."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ftrun.cli import job_options
from ftrun.cli.render import jobs_table, make_console, print_job
from ftrun.cli.safetext import plain
from ftrun.cli.watch import watch as watch_jobs
from ftrun.config import resolve_run_dir
from ftrun.errors import FtrunError, UsageError
from ftrun.jobview import load_job
from ftrun.jobview.goodput import job_goodput
from ftrun.journal_read import find_job_dir, list_job_dirs
from ftrun.transport.slurm_allocation import job_fields

console = make_console()


def status(
    job: str | None = typer.Argument(
        None, help="A job id (or a unique prefix); all jobs if left out."
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    watch: bool = typer.Option(
        False, "--watch", "-w", help="Refresh in place until Ctrl-C (piped: a snapshot each time)."
    ),
    interval: float = typer.Option(1.0, "--interval", help="Seconds between --watch refreshes."),
    run_dir: Path | None = job_options.RUN_DIR,
) -> None:
    """List jobs, or show one job with its incidents; --watch follows them live."""
    directory = resolve_run_dir(run_dir)
    if watch:
        if as_json:
            raise UsageError("--watch and --json do not go together", hint="poll --json instead")
        if not 0.1 <= interval <= 3600:
            raise UsageError(f"--interval must be 0.1 to 3600 seconds (got {interval:g})")
        if job is not None:
            find_job_dir(directory, job)  # an unknown job is an error now, not a blank screen
        watch_jobs(console, directory, job, interval)
        return
    if job is None:
        views = sorted(
            (load_job(d) for d in list_job_dirs(directory)),
            key=lambda v: v.started_t or 0.0,
            reverse=True,
        )
        if as_json:
            print(json.dumps([v.to_json() for v in views], indent=2))
        elif not views:
            console.print(f"no jobs in {directory}")
        else:
            console.print(jobs_table(views))
        return
    view = load_job(find_job_dir(directory, job))
    slurm = slurm_view(view.slurm_job_id)
    if as_json:
        out = {**view.to_json(detail=True), "slurm": slurm}
        out["goodput"] = job_goodput(view).to_json()
        print(json.dumps(out, indent=2))
    else:
        print_job(console, view)
        if slurm is not None:
            console.print(
                f"slurm: job {view.slurm_job_id} {slurm.get('JobState', '?')} on "
                f"{slurm.get('NodeList', '?')}, restarts {slurm.get('Restarts', '?')}"
                + (f" ({slurm['error']})" if "error" in slurm else ""),
                soft_wrap=True,
            )
        console.print()
        console.print(plain(f"more: ftrun inspect {view.job_id}", "dim"))


def slurm_view(slurm_job_id: str | None) -> dict[str, str] | None:
    """Slurm's side of a job that ran under it (state, nodes, requeues), next to ftrun's: read
    from scontrol now, since Slurm forgets a job MinJobAge after it ends."""
    if slurm_job_id is None:
        return None
    try:
        fields = job_fields(slurm_job_id)
    except FtrunError as e:
        gone = "Invalid job id" in e.message
        return {"error": "Slurm no longer knows the job" if gone else e.message}
    return {k: fields[k] for k in ("JobState", "NodeList", "Restarts", "RunTime") if k in fields}


def register(app: typer.Typer) -> None:
    app.command()(status)
