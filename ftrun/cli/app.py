"""`ftrun`: the typer app, and the one place FtrunError becomes a message, a hint and an exit code."""

from __future__ import annotations

import os
import sys

import typer
from rich.markup import escape

from ftrun import envcontract
from ftrun.cli import chaos, hosts, inspect, launch, plan, profile, sbatch, status
from ftrun.cli.render import make_console
from ftrun.errors import FtrunError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="A fault-tolerant launcher that wraps torchrun.",
)

err_console = make_console(stderr=True)


def _register() -> None:
    # Commands register here, from the one module that imports them all: none imports app back.
    launch.register(app)
    sbatch.register(app)
    status.register(app)
    inspect.register(app)
    chaos.register(app)
    hosts.register(app)
    plan.register(app)
    profile.register(app)


def main() -> None:
    _register()
    try:
        # Standalone mode: typer reports its own usage errors (unknown option...) with exit 2.
        app()
    except FtrunError as e:
        report_error(e)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:
        if os.environ.get(envcontract.DEBUG) == "1":
            raise
        err_console.print(f"[bold red]error:[/] internal error: {e.__class__.__name__}: {e}")
        err_console.print(
            "[dim]hint: run again with FTRUN_DEBUG=1 for the traceback, and report it[/]"
        )
        sys.exit(1)


def report_error(e: FtrunError) -> None:
    if os.environ.get(envcontract.DEBUG) == "1":
        import traceback

        traceback.print_exception(e)
    # Messages are plain text: "[timeouts] has ..." is a section name, not rich markup.
    err_console.print(f"[bold red]error:[/] {escape(e.message)}", soft_wrap=True)
    if e.hint:
        err_console.print(f"[dim]hint: {escape(e.hint)}[/]", soft_wrap=True)
