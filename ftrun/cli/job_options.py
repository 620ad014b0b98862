"""Options of the commands that work on an existing job (status, inspect, hosts, chaos, resume,
replay): one definition, so they read and say the same."""

from __future__ import annotations

from typing import Any

import typer

from ftrun import envcontract

RUN_DIR: Any = typer.Option(
    None,
    "--run-dir",
    envvar=envcontract.RUN_DIR,
    help="Where job directories are [default: ~/.ftrun/runs].",
)
