"""Every float option of every command refuses NaN and infinity, by ftrun.numbers' rule.

Python's float() takes `nan` and `inf`, so the command line does too, and NaN then passes every
bound (issue 34). Rather than a check beside each of the forty-odd float options, which the
next option would miss, the command tree typer builds is walked once before it runs and each
command's callback is wrapped: before the command sees its arguments, a float that is not
finite is a usage error naming its flag (exit 2, one line). Only the public parts of the
command objects are used (callback, params, name, opts): their types are typer's own from
typer 0.23 on, click's before.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from ftrun import numbers
from ftrun.errors import UsageError


def _checked(callback: Callable[..., Any], flags: dict[str, str]) -> Callable[..., Any]:
    @functools.wraps(callback)
    def run(*args: Any, **kwargs: Any) -> Any:
        problems = [
            numbers.problem(flags.get(name, name), value)
            for name, value in kwargs.items()
            if isinstance(value, float) and not math.isfinite(value)
        ]
        if problems:
            raise UsageError("; ".join(p for p in problems if p), hint="give a finite number")
        return callback(*args, **kwargs)

    run.__wrapped_finite__ = True  # type: ignore[attr-defined]
    return run


def finite_floats(command: Any) -> Any:
    """Check the floats of `command` and of all its subcommands, in place; returns `command`."""
    callback = getattr(command, "callback", None)
    if callback is not None and not getattr(callback, "__wrapped_finite__", False):
        flags = {p.name: (p.opts[0] if p.opts else p.name) for p in command.params if p.name}
        command.callback = _checked(callback, flags)
    for sub in getattr(command, "commands", {}).values():
        finite_floats(sub)
    return command
