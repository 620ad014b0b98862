"""What a well-formed journal event is: the types of the fields its readers rely on.

`events.jsonl` is a file on disk, not a channel ftrun controls end to end: a full disk, a bad
copy, a hand edit or a hostile user can leave lines in it that are JSON but not events
(`"t": "x"`, `"gen": []`, a list instead of an object). The readers (`jobview.fold`,
`journal.resume_point`) read fields by name and use them as numbers, keys and strings, so each
event is checked here, once, against the types they expect, and an event that fails is dropped
and counted as a bad line rather than made safe field by field in every reader: one table is
easier to keep right than a guard at every `ev[...]`, and a job with dropped lines is shown as
damaged, so nothing is hidden.

A field the table does not know is not checked (new event kinds carry their own fields); a field
it knows has the same meaning, and type, in every event kind that carries it.
"""

from __future__ import annotations

import math
from typing import Any

# Wall-clock times: finite, and inside what datetime can show (year 1970 to about 5138).
MAX_TIME = 1e11

_NUMBER = (int, float)


# Parsed JSON holds exactly int, float, str, list, dict, bool and None (no subclasses), so a
# type test is exact; `type(v) is int` also leaves out bool, and it is what makes a check cost
# little on the journal's millions of lines.
def _is_time(v: Any) -> bool:
    return (type(v) is float or type(v) is int) and 0 <= v < MAX_TIME


def _is_int(v: Any) -> bool:
    return type(v) is int or (isinstance(v, int) and not isinstance(v, bool))


def _int_or_none(v: Any) -> bool:
    return v is None or type(v) is int or (isinstance(v, int) and not isinstance(v, bool))


def _is_number(v: Any) -> bool:
    return isinstance(v, _NUMBER) and not isinstance(v, bool) and math.isfinite(v)


def _is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _is_str_dict(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(x, str) for x in v.values())


def _or_none(check: Any) -> Any:
    return lambda v: v is None or check(v)


_CHECKS: dict[str, tuple[Any, str]] = {}


def _fields(names: str, check: Any, expected: str) -> None:
    for name in names.split():
        _CHECKS[name] = (check, expected)


_fields("t", _is_time, "a time in seconds since the epoch")
_fields(
    "fault_t detected_t torn_down_t controller_create_time", _or_none(_is_time), "a time or null"
)
_fields("gen incident rank step exit_code clean_rank run", _int_or_none, "an integer or null")
_fields(
    "world_size slurm_restart_count controller_pid max_nodes nproc_per_node",
    _int_or_none,
    "an integer or null",
)
_fields(
    "allowance_s past_allowance_s idle_s predicted_step_s full_step_s restore_s stall_s wait_s",
    _or_none(_is_number),
    "a number",
)
_fields(
    "name host signal exception traceback traceback_source injected section reason tier "
    "decision rule state outcome summary why fault slurm_job_id controller_host",
    _or_none(lambda v: isinstance(v, str)),
    "a string or null",
)
_fields("hosts spares tail stacks_missing_from", _or_none(_is_str_list), "a list of strings")
_fields("stacks states", _or_none(_is_str_dict), "a table of strings")
_fields("root_cause", _or_none(lambda v: isinstance(v, dict)), "an object or null")


# Fields an event kind cannot do without: fold files generations and incidents under them.
_REQUIRED_INT = {"generation_launched": "gen", "fault_detected": "incident"}


def event_problem(event: Any) -> str | None:
    """Why `event` (a parsed JSON line) is not a well-formed event, or None if it is."""
    if not isinstance(event, dict):
        return f"a JSON {type(event).__name__}, not an object"
    if not isinstance(event.get("kind"), str):
        return "no string `kind`"
    required = _REQUIRED_INT.get(event["kind"])
    if required is not None and not _is_int(event.get(required)):
        return f"a {event['kind']} event without an integer `{required}`"
    for name, value in event.items():
        known = _CHECKS.get(name)
        if known is not None and not known[0](value):
            return f"`{name}` is not {known[1]}"
    return None
