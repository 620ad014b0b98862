"""`ftrun`: the typer app, and the one place FtrunError becomes a message, a hint and an exit code."""

from __future__ import annotations

import importlib
import os
import sys

import typer
from rich.text import Text

from ftrun import envcontract
from ftrun.cli.finite import finite_floats
from ftrun.cli.launch_options import VERSION
from ftrun.cli.safetext import clean, make_console, plain
from ftrun.errors import FtrunError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Help texts are plain: "[default: ...]" in them must show, not be taken for rich markup.
    rich_markup_mode=None,
    help="A fault-tolerant launcher that wraps torchrun.",
    # -h as torchrun's parser takes it; every command's context inherits it.
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _ftrun(version: bool = VERSION) -> None:
    """A fault-tolerant launcher that wraps torchrun."""


err_console = make_console(stderr=True)


# The commands, in --help's order: each is the module ftrun.cli.<name>, whose register(app) adds
# it. They register here, from the one module that imports them all: none imports app back.
COMMANDS = (
    "launch",
    "resume",
    "sbatch",
    "status",
    "inspect",
    "chaos",
    "hosts",
    "plan",
    "profile",
    "simulate",
    "replay",
)
_registered: list[str] = []


def _register(command: str | None = None) -> None:
    """Every command, or only `command` when it names one: `ftrun status` imports the status
    module alone, not launch's controller and the simulator (0.17 s of CPU a call, 0.09 s
    alone; the tests and scripts that poll status or inspect call it hundreds of times)."""
    wanted = [command] if command in COMMANDS else list(COMMANDS)
    if all(name in _registered for name in wanted):  # main() again in one process (CLI tests)
        return
    if len(wanted) > 1 and _registered:  # all of them after one: again, in --help's order
        app.registered_commands.clear()
        _registered.clear()
    for name in wanted:
        importlib.import_module(f"ftrun.cli.{name}").register(app)
        _registered.append(name)


def main() -> None:
    _register(sys.argv[1] if len(sys.argv) > 1 else None)
    try:
        # Standalone mode: typer reports its own usage errors (unknown option...) with exit 2.
        finite_floats(typer.main.get_command(app))(prog_name="ftrun")
    except FtrunError as e:
        report_error(e)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:
        if os.environ.get(envcontract.DEBUG) == "1":
            raise
        err_console.print(
            Text.assemble(
                ("error:", "bold red"),
                f" internal error: {clean(e.__class__.__name__)}: {clean(e)}",
            ),
            soft_wrap=True,
        )
        err_console.print(
            Text("hint: run again with FTRUN_DEBUG=1 for the traceback, and report it", "dim")
        )
        sys.exit(1)


def report_error(e: FtrunError) -> None:
    if os.environ.get(envcontract.DEBUG) == "1":
        import traceback

        traceback.print_exception(e)
    # Messages are plain text that embeds user text ("[timeouts] has ...", a job id, a path):
    # ftrun's style around it, never markup parsed from it (safetext.py).
    err_console.print(Text.assemble(("error:", "bold red"), " ", clean(e.message)), soft_wrap=True)
    if e.hint:
        err_console.print(plain(f"hint: {e.hint}", "dim"), soft_wrap=True)
