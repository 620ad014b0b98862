"""A job's config.json, checked against the shape of LaunchConfig before `ftrun resume` builds
one from it.

config.json is what `ftrun launch` wrote (LaunchConfig.to_json, plus the fault policy), but a
resume must not trust that it still is: a truncated or hand-edited file, or one from another
version, used to reach LaunchConfig with a number where a list goes and end in "internal error".
The schema is LaunchConfig's own type hints, so it cannot drift from the config: every key that
is a field must hold a JSON value of the field's type (lists for tuples, strings for paths, the
names only for `env` and `forward_env`); every problem is named, all in one message.
"""

from __future__ import annotations

import functools
import types
import typing
from pathlib import Path
from typing import Any

from ftrun.config import LaunchConfig
from ftrun.transport.registry import BACKENDS

# Kept as names only (values may be secrets): lists of strings in config.json.
NAMES_ONLY = ("env", "forward_env")


@functools.cache
def field_types() -> dict[str, Any]:
    hints = typing.get_type_hints(LaunchConfig)
    return {name: hints[name] for name in LaunchConfig.__dataclass_fields__}


def problems(saved: dict[str, Any]) -> list[str]:
    """What in `saved` does not fit LaunchConfig's fields (and `policy`, a table); [] if all."""
    found = []
    types_of = field_types()
    for name, value in saved.items():
        if name == "policy":
            ok, want = value is None or isinstance(value, dict), "a table"
        elif name == "transport_options":
            ok, want = value is None or isinstance(value, dict), "a table"
            if ok and value:
                found += options_problems(saved.get("transport"), value)
        elif name in NAMES_ONLY:
            ok, want = _fits(value, tuple[str, ...]), "a list of names"
        elif name in types_of:
            ok, want = _fits(value, types_of[name]), _name(types_of[name])
        else:
            continue  # not a field (a newer version's): LaunchConfig never sees it
        if not ok:
            found.append(f"{name} must be {want} (got {_shown(value)})")
    return found


def options_problems(transport: Any, saved: dict[str, Any]) -> list[str]:
    """What in a saved `transport_options` table does not fit its transport's options
    (transport/options.py); an unknown transport is resume's to refuse."""
    if not isinstance(transport, str) or transport not in BACKENDS:
        return []
    kind = BACKENDS[transport].options
    hints = typing.get_type_hints(kind)
    return [
        f"transport_options.{name} must be {_name(hints[name])} (got {_shown(value)})"
        for name, value in saved.items()
        if name in hints and not _fits(value, hints[name])
    ]


def _fits(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in typing.get_args(hint))
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, list):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_fits(item, args[0]) for item in value)
        return len(value) == len(args) and all(map(_fits, value, args))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint in (str, Path):
        return isinstance(value, str)
    return True  # a type config.json does not hold: LaunchConfig judges it


def _name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_name(arg) for arg in typing.get_args(hint))
    if origin is tuple:
        item = typing.get_args(hint)[0]
        return "a list of " + ("strings" if item in (str, Path) else f"({_name(item)})")
    if hint is type(None):
        return "null"
    return {bool: "true or false", int: "an integer", float: "a number"}.get(hint, "a string")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
