"""`ftrun chaos JOB ACTION`: inject a fault into a running job, through its controller.

The request travels the authenticated control plane (the job secret is in the job directory,
readable by its owner only), is journaled as injected, and is carried out by the agent, at a
given step if asked, so rehearsals and benchmarks are deterministic.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Optional

import typer

from ftrun.cli.render import make_console
from ftrun.config import resolve_run_dir
from ftrun.controller.chaos import ACTIONS
from ftrun.errors import ProtocolError, UsageError
from ftrun.journal import find_job_dir
from ftrun.protocol import open_channel

console = make_console(stderr=True)
REPLY_TIMEOUT_S = 10.0


def chaos(
    job: str = typer.Argument(..., help="A job id (or a unique prefix)."),
    action: str = typer.Argument(..., help=f"One of: {', '.join(ACTIONS)}."),
    rank: Optional[int] = typer.Option(None, "--rank", help="Target rank (kill-rank, hang-rank)."),
    host: Optional[str] = typer.Option(None, "--host", help="Target host (kill-agent, freeze-agent)."),
    at_step: Optional[int] = typer.Option(None, "--at-step", help="Wait until this step first."),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", envvar="FTRUN_RUN_DIR",
                                           help="Where job directories are [default: ~/.ftrun/runs]."),
) -> None:
    """Inject a fault: kill-rank, hang-rank (SIGSTOP), kill-agent, freeze-agent (SIGSTOP)."""
    if action not in ACTIONS:
        raise UsageError(f"unknown chaos action {action!r}", hint=f"one of: {', '.join(ACTIONS)}")
    job_dir = find_job_dir(resolve_run_dir(run_dir), job)
    try:
        control = json.loads((job_dir / "control.json").read_text())
    except (OSError, ValueError):
        raise UsageError(f"job {job_dir.name} is not running", hint=f"`ftrun status {job_dir.name}`") from None
    ok, message = asyncio.run(_request(control, {"action": action, "rank": rank, "host": host,
                                                 "at_step": at_step}))
    if not ok:
        raise UsageError(f"chaos refused: {message}", hint=f"`ftrun status {job_dir.name}`")
    console.print(f"ftrun chaos: {message}")


async def _request(control: dict, request: dict) -> tuple[bool, str]:
    try:
        chan = await open_channel(control["host"], control["port"], control["secret"],
                                  timeout_s=REPLY_TIMEOUT_S)
        chan.send("hello", role="chaos")
        chan.send("chaos", **request)
        await chan.drain()
        reply = await asyncio.wait_for(chan.receive(), REPLY_TIMEOUT_S)
        while reply["kind"] != "chaos_ack":
            reply = await asyncio.wait_for(chan.receive(), REPLY_TIMEOUT_S)
        chan.close()
        return bool(reply.get("ok")), str(reply.get("message"))
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ProtocolError, KeyError) as e:
        return False, f"could not reach the controller ({e.__class__.__name__}: {e})"


def register(app: typer.Typer) -> None:
    app.command()(chaos)
