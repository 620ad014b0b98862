"""`ftrun status [JOB]`: what is running and what ran. Reads only job directories.

One job: its incidents, its goodput so far (— and why without a progress signal), and the
current generation's ranks (host, local rank, pid, state), so one rank can be found and
signalled (`kill -USR1 PID` on its host)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table
from rich.text import Text

from ftrun.cli import job_options
from ftrun.cli.goodput_render import ratio_text
from ftrun.cli.render import jobs_table, make_console, print_job
from ftrun.cli.safetext import clean, plain
from ftrun.cli.watch import watch as watch_jobs
from ftrun.config import resolve_run_dir
from ftrun.errors import FtrunError, UsageError
from ftrun.jobview import JobView, load_job
from ftrun.jobview.goodput import job_goodput
from ftrun.journal.read import find_job_dir, list_job_dirs
from ftrun.slurmctl import job_fields

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
        print_goodput(view)
        print_ranks(view)
        if slurm is not None:
            console.print(
                f"slurm: job {view.slurm_job_id} {slurm.get('JobState', '?')} on "
                f"{slurm.get('NodeList', '?')}, restarts {slurm.get('Restarts', '?')}"
                + (f" ({slurm['error']})" if "error" in slurm else ""),
                soft_wrap=True,
            )
        console.print()
        console.print(plain(f"more: ftrun inspect {view.job_id}", "dim"))


RANK_STYLE = {"running": "cyan", "exited": "", "killed": "yellow", "unknown": "dim"}


def print_goodput(view: JobView) -> None:
    """One line: the job's goodput so far, or `—` and why (no progress signal)."""
    share = job_goodput(view).job
    if share.wall_s <= 0:
        return
    if share.unknown is not None:
        console.print(Text.assemble("goodput —: ", clean(share.unknown)), soft_wrap=True)
    else:
        console.print(
            f"goodput {ratio_text(share)}" + (" so far" if view.state == "running" else "")
        )


def print_ranks(view: JobView) -> None:
    """The current generation's ranks: where each runs, its pid, and what became of it."""
    if not view.ranks:
        return
    table = Table(box=None, header_style="bold", title_justify="left")
    for col in ("RANK", "HOST", "LOCAL", "PID", "STATE"):
        table.add_column(col)
    for r in view.ranks:
        table.add_row(
            str(r.rank),
            plain(r.host or "-"),
            "-" if r.local_rank is None else str(r.local_rank),
            "-" if r.pid is None else str(r.pid),
            plain(r.state_text, RANK_STYLE.get(r.state, "")),
        )
    console.print()
    console.print(Text(f"ranks of generation {view.generation}", style="bold"))
    console.print(table)
    if any(r.state == "running" for r in view.ranks):
        console.print(plain("signal one rank: kill -USR1 PID, on its host", "dim"))


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
