"""Fuzzing every option of `launch`, `status`, `inspect`, `plan`, `hosts` and `chaos` with
arbitrary strings, in-process through the real boundary (clidriver.py). What holds for every
value: no internal error and no traceback, whatever went wrong said as one message. A launch in
the fuzz never starts a job: its script does not exist, so validation always refuses it (and
reports every other problem in the same message, which is what is checked for numbers).
`hosts` and `chaos` get an empty run dir, so they never reach a job."""

from __future__ import annotations

import tempfile
import typing
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.main import get_command

from ftrun.cli.app import _register, app
from tests.hostile.clidriver import Run, ftrun_cli

FUZZ = settings(max_examples=60, deadline=None)
NO_SCRIPT = "/nonexistent/ftrun-fuzz/script.py"
# Hostile and near-valid values; text drawn freely beside them (NUL included: argv cannot
# carry one, but an in-process caller and a config file can).
VALUE = st.one_of(
    st.sampled_from(
        [
            "",
            "-1",
            "0",
            "1",
            "abc",
            "\x00",
            "[/]",
            "[bold]x",
            "\x1b[2J",
            "1e999",
            "nan",
            "inf",
            "80GB",
            "1,2",
            "a@b:99999",
            "USR1",
            "~",
            "../..",
            "/",
            "-",
            "--",
            "5s",
        ]
    ),
    st.text(max_size=30),
)
ENV = {"SLURM_JOB_ID": None, "SLURM_JOBID": None, "FTRUN_RUN_DIR": None}


def _options(command: str) -> list[tuple[str, str]]:
    """(flag, type name) of each option of `command` that takes a value."""
    _register()
    params = get_command(app).commands[command].params  # type: ignore[attr-defined]
    return [
        (p.opts[0], _kind(p.type_descriptor.annotation))
        for p in params
        if p.param_type_name == "option" and not p.is_flag
    ]


def _kind(annotation: object) -> str:
    """`int`, `float` (also `int | None`), or `other`."""
    kinds = {annotation, *typing.get_args(annotation)}
    return "int" if int in kinds else "float" if float in kinds else "other"


LAUNCH = _options("launch")
NUMBERS = [flag for flag, kind in LAUNCH if kind in ("int", "float")]


def said_once(run: Run) -> None:
    assert run.clean, run.output
    assert run.code != 0, run.output
    said = run.stderr.count("error:") + run.stderr.count("Error")
    assert said == 1, run.stderr


@FUZZ
@given(st.lists(st.tuples(st.sampled_from([f for f, _ in LAUNCH]), VALUE), min_size=1, max_size=4))
def test_launch_options(options: list[tuple[str, str]]):
    with tempfile.TemporaryDirectory() as tmp:
        argv = [a for flag, value in options for a in (flag, value)]
        run = ftrun_cli(["launch", "--run-dir", tmp, *argv, NO_SCRIPT], ENV)
        said_once(run)
        assert list(Path(tmp).iterdir()) == []  # validation wrote nothing


@pytest.mark.parametrize("flag", NUMBERS)
@pytest.mark.parametrize("value", ["", "abc", "\x00", "-1"])
def test_clearly_invalid_numbers_are_named(flag: str, value: str):
    if value == "-1" and flag in ("--grace-period",):  # the old name: reported under the new
        flag = "--term-timeout"
    with tempfile.TemporaryDirectory() as tmp:
        run = ftrun_cli(["launch", "--run-dir", tmp, flag, value, NO_SCRIPT], ENV)
    said_once(run)
    names = {flag, flag.lstrip("-"), *(o for o in _aliases(flag))}
    assert any(name in run.stderr for name in names), run.stderr


def _aliases(flag: str) -> list[str]:
    for p in get_command(app).commands["launch"].params:  # type: ignore[attr-defined]
        if getattr(p, "opts", [None])[0] == flag:
            return [*p.opts, *p.secondary_opts]
    return []


@FUZZ
@given(VALUE, VALUE, st.booleans(), st.sampled_from(["status", "inspect"]))
def test_status_and_inspect(job: str, sub: str, as_json: bool, command: str):
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = str(Path(tmp) / sub.replace("\x00", "")) if sub else tmp
        args = [command, "--run-dir", run_dir, *(["--json"] if as_json else []), "--", job]
        run = ftrun_cli(args, ENV)
        assert run.clean, run.output
        if run.code != 0:
            said_once(run)


@FUZZ
@given(st.lists(st.tuples(st.sampled_from([f for f, _ in _options("plan")]), VALUE), max_size=4))
def test_plan_options(options: list[tuple[str, str]]):
    argv = [a for flag, value in options for a in (flag, value)]
    run = ftrun_cli(["plan", *argv], ENV)
    assert run.clean, run.output
    if run.code != 0:
        said_once(run)


@FUZZ
@given(
    st.sampled_from(["hosts", "chaos"]),
    st.lists(VALUE, min_size=3, max_size=3),
    st.lists(st.tuples(st.sampled_from(["--rank", "--host", "--at-step"]), VALUE), max_size=2),
)
def test_hosts_and_chaos_reach_no_job(command: str, positional: list[str], options):
    if command == "hosts":
        options = []
    else:
        positional = positional[:2]
    with tempfile.TemporaryDirectory() as tmp:
        argv = [a for flag, value in options for a in (flag, value)]
        run = ftrun_cli([command, "--run-dir", tmp, *argv, "--", *positional], ENV)
    said_once(run)
