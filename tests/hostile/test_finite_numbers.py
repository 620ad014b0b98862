"""Every float option of every command refuses NaN and infinity (issue 34): NaN passes every
bound, so `--hang-floor nan` turned hang detection off and `--term-timeout inf` waited for ever.

The options are found from the commands themselves, so an option added later is tried too."""

from __future__ import annotations

import typing
from collections.abc import Iterator

import pytest
import typer.main

from ftrun import numbers
from ftrun.cli.app import _register, app
from tests.hostile.clidriver import ftrun_cli


def float_options() -> Iterator[tuple[str, str, list[str]]]:
    """(command, flag, placeholder arguments) for every option typed float or float | None."""
    _register()
    group = typer.main.get_command(app)
    for name, command in sorted(group.commands.items()):  # type: ignore[attr-defined]
        hints = typing.get_type_hints(command.callback)
        arguments = [p for p in command.params if p.param_type_name == "argument" and p.required]
        placeholders = ["x"] * len(arguments)
        for param in command.params:  # required options: a string will do (replay's commands)
            if param.param_type_name == "option" and param.required:
                placeholders = [param.opts[0], "x", *placeholders]
        for param in command.params:
            if param.param_type_name == "option" and hints.get(param.name) in (float, float | None):
                yield name, param.opts[0], placeholders


CASES = list(float_options())


def test_the_float_options_are_found():
    """Not vacuous: the commands that take seconds and rates are all among them."""
    found = {(command, flag) for command, flag, _ in CASES}
    for expected in [
        ("launch", "--hang-floor"),
        ("launch", "--term-timeout"),
        ("sbatch", "--host-lost-timeout"),
        ("simulate", "--time-scale"),
        ("replay", "--tail"),
        ("profile", "--timeout"),
        ("status", "--interval"),
    ]:
        assert expected in found, sorted(found)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_every_float_option_refuses_a_value_that_is_not_finite(value: str):
    for command, flag, placeholders in CASES:
        run = ftrun_cli([command, flag, value, *placeholders])
        assert run.code == 2 and run.clean, (command, flag, run.output)
        ours = f"error: {flag} must be a finite number (got {float(value)})"
        # An option with a range of its own (torchrun's --monitor-interval) is refused by typer
        # first, by its flag: NaN fails the range's comparison, -inf its minimum.
        by_range = value != "inf" and f"Invalid value for '{flag}'" in run.stderr
        assert ours in run.stderr or by_range, (command, flag, run.stderr)


def test_the_rule():
    assert numbers.problem("--x", 1.5, minimum=0) is None
    assert numbers.problem("--x", -1, minimum=0) == "--x must be 0 or more (got -1)"
    assert numbers.problem("--x", 7, maximum=5) == "--x must be 5 or less (got 7)"
    assert (
        numbers.problem("--x", float("nan"), minimum=0) == "--x must be a finite number (got nan)"
    )
    assert numbers.problem("--x", True) is not None  # a bool is not a number
    assert not numbers.is_number("3")
