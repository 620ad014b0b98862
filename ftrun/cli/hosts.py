"""`ftrun hosts JOB add|remove HOST`: change a running job's hosts.

`add` starts an agent on HOST: it fills a job that shrank (at the next safe point: once the
current generation steps) or waits as a ready spare. `remove` takes HOST out: if it runs ranks,
the job relaunches without it (a spare takes its place when one is ready).
"""

from __future__ import annotations

from pathlib import Path

import typer

from ftrun.cli import job_options
from ftrun.cli.control import ask
from ftrun.cli.render import make_console
from ftrun.config import resolve_run_dir
from ftrun.errors import UsageError
from ftrun.hostlist import split_target
from ftrun.journal.read import find_job_dir

console = make_console(stderr=True)
ACTIONS = ("add", "remove")


def hosts(
    job: str = typer.Argument(..., help="A job id (or a unique prefix)."),
    action: str = typer.Argument(..., help="add or remove."),
    host: str = typer.Argument(..., help="The host, as for --hosts: host, user@host[:port]."),
    run_dir: Path | None = job_options.RUN_DIR,
) -> None:
    """Add a host to a running job (it grows back or waits as a spare), or remove one."""
    if action not in ACTIONS:
        raise UsageError(f"unknown hosts action {action!r}", hint="one of: add, remove")
    split_target(host)  # a malformed host is refused here, with the usual message
    job_dir = find_job_dir(resolve_run_dir(run_dir), job)
    ok, message = ask(job_dir, "hosts", "hosts_ack", action=action, host=host)
    if not ok:
        raise UsageError(
            f"hosts {action} refused: {message}",
            hint=f"`ftrun status {job_dir.name}` shows the job's hosts",
        )
    console.print(f"ftrun hosts: {message}")


def register(app: typer.Typer) -> None:
    app.command()(hosts)
