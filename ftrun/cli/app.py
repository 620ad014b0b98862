"""`ftrun`: the typer app, and the one place FtrunError becomes a message, a hint and an exit code."""

from __future__ import annotations

import os
import sys

import typer
from rich.console import Console

from ftrun.errors import FtrunError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="A fault-tolerant launcher that wraps torchrun.")

err_console = Console(stderr=True, highlight=False)


def _register() -> None:
    from ftrun.cli import inspect, launch, status

    launch.register(app)
    status.register(app)
    inspect.register(app)


def main() -> None:
    _register()
    try:
        code = app(standalone_mode=False)
    except FtrunError as e:
        report_error(e)
        sys.exit(e.exit_code)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:  # click's usage errors and anything unexpected
        import click

        if isinstance(e, click.exceptions.ClickException):
            e.show()
            sys.exit(e.exit_code)
        if isinstance(e, click.exceptions.Abort):
            sys.exit(130)
        if os.environ.get("FTRUN_DEBUG") == "1":
            raise
        err_console.print(f"[bold red]error:[/] internal error: {e.__class__.__name__}: {e}")
        err_console.print("[dim]hint: run again with FTRUN_DEBUG=1 for the traceback, "
                          "and report it[/]")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


def report_error(e: FtrunError) -> None:
    if os.environ.get("FTRUN_DEBUG") == "1":
        import traceback

        traceback.print_exception(e)
    err_console.print(f"[bold red]error:[/] {e.message}", soft_wrap=True)
    if e.hint:
        err_console.print(f"[dim]hint: {e.hint}[/]", soft_wrap=True)
