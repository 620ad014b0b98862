"""The one rule for a number a user gives ftrun: finite, and within its bounds.

NaN passes every comparison-based bound (`nan < 0` and `nan > 1e9` are both false) and inf passes
every lower one, so `--hang-floor nan` turned hang detection off and `--term-timeout inf` waited
for ever (issue 34). The command line (every float option, ftrun/cli/finite.py), the launch
configuration (config.py) and the policy file (controller/policy_file.py) all judge a number
here, and word a refusal the same way. Ground floor: imports nothing of ftrun.
"""

from __future__ import annotations

import math
from typing import Any


def is_number(value: Any) -> bool:
    """An int or a float, not a bool (which Python counts as an int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def problem(
    name: str, value: Any, *, minimum: float | None = None, maximum: float | None = None
) -> str | None:
    """Why `value` is not a number `name` takes, worded for the user; None when it is one."""
    if not is_number(value) or not math.isfinite(value):
        return f"{name} must be a finite number (got {value})"
    if minimum is not None and value < minimum:
        return f"{name} must be {minimum:g} or more (got {value:g})"
    if maximum is not None and value > maximum:
        return f"{name} must be {maximum:g} or less (got {value:g})"
    return None
