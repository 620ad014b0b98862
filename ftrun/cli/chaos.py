"""`ftrun chaos JOB ACTION`: inject a fault into a running job, through its controller.

The request travels the authenticated control plane (the job secret is in the job directory,
readable by its owner only), is journaled as injected, and is carried out by the agent, at a
given step if asked, so rehearsals and benchmarks are deterministic.
"""

from __future__ import annotations

from pathlib import Path

import typer

from ftrun.cli import job_options
from ftrun.cli.control import ask
from ftrun.cli.render import make_console
from ftrun.config import resolve_run_dir
from ftrun.controller.chaos import ACTIONS
from ftrun.errors import UsageError
from ftrun.journal.read import find_job_dir
from ftrun.wire.schema import MAX_RANKS, MAX_STEP

console = make_console(stderr=True)


def chaos(
    job: str = typer.Argument(..., help="A job id (or a unique prefix)."),
    action: str = typer.Argument(..., help=f"One of: {', '.join(ACTIONS)}."),
    rank: int | None = typer.Option(
        None, "--rank", help="Target rank (kill-rank, hang-rank).", min=0, max=MAX_RANKS - 1
    ),
    host: str | None = typer.Option(None, "--host", help="Target host (kill-agent, freeze-agent)."),
    at_step: int | None = typer.Option(
        None,
        "--at-step",
        help="Wait until the job reaches this step (the rank's own, where it reports steps).",
        min=0,
        max=MAX_STEP,
    ),
    run_dir: Path | None = job_options.RUN_DIR,
) -> None:
    """Inject a fault: kill-rank, hang-rank (SIGSTOP), kill-agent, freeze-agent (SIGSTOP)."""
    if action not in ACTIONS:
        raise UsageError(f"unknown chaos action {action!r}", hint=f"one of: {', '.join(ACTIONS)}")
    job_dir = find_job_dir(resolve_run_dir(run_dir), job)
    ok, message = ask(
        job_dir, "chaos", "chaos_ack", action=action, rank=rank, host=host, at_step=at_step
    )
    if not ok:
        raise UsageError(f"chaos refused: {message}", hint=f"`ftrun status {job_dir.name}`")
    console.print(f"ftrun chaos: {message}")


def register(app: typer.Typer) -> None:
    app.command()(chaos)
