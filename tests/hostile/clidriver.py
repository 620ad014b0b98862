"""`ftrun` run in-process through its real boundary, `ftrun.cli.app.main`: typer parses, a
command runs, an FtrunError becomes a message, a hint and an exit code.

In-process so that a fuzzer can afford hundreds of runs. An exception the boundary does not
expect is printed as `internal error: <class>: <message>` with exit 1: `Run.clean` says there
was none, and no traceback either.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from unittest import mock

from typer.testing import CliRunner

from ftrun.cli.app import main


@dataclass(frozen=True)
class Run:
    code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    @property
    def clean(self) -> bool:
        """No internal error, no traceback: whatever went wrong was said as a message; and no
        raw ESC (the output is piped, so rich styles nothing: an ESC could only be injected)."""
        return (
            "internal error" not in self.stderr
            and "Traceback" not in self.output
            and "\x1b" not in self.output
        )


def ftrun_cli(args: list[str], env: Mapping[str, str | None] | None = None) -> Run:
    runner = CliRunner()
    with (
        runner.isolation(env={"FTRUN_DEBUG": None, "COLUMNS": "200", **(env or {})}) as streams,
        mock.patch.object(sys, "argv", ["ftrun", *args]),
    ):
        code: int = 0
        try:
            main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        sys.stdout.flush()  # print() (the --json output) writes through a buffered wrapper
        sys.stderr.flush()
        out, err = (streams[0].getvalue(), streams[1].getvalue())
    return Run(code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))
