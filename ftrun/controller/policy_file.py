"""The fault policy a job runs with: rules, quarantine and hang settings, from defaults and an
optional TOML file (`ftrun launch --policy FILE`). See docs/policy.md for the format.

    [[rules]]                       # tried in order, before the built-in rules
    name = "bad shard is fatal"
    exception = "DataCorruption"    # regex on the exception line
    tier = "fatal"                  # restart-in-place | replace-node | fatal

    [quarantine]                    # a host failing `failures` times in `window_s` is benched
    failures = 3                    # for `expiry_s`
    window_s = 600
    expiry_s = 3600

    [hang]
    startup_timeout_s = 300         # before the first step (only when progress is expected)
    floor_s = 2                     # afterwards: max(floor_s, factor x median step time)
    factor = 5
    busy_floor_s = 60               # a rank computing past its allowance: a spin after this
    confirm_s = 1                   # every rank waiting this long past an allowance: a hang

    [timeouts]                      # the control plane's timing (docs/timeouts.md)
    heartbeat_interval_s = 0.25
    host_lost_timeout_s = 1.0
    fence_timeout_s = 3.0
    local_stall_timeout_s = 60
"""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftrun import numbers
from ftrun.agent.hang import HangPolicy
from ftrun.controller.evidence import KINDS
from ftrun.controller.host_health import QuarantinePolicy
from ftrun.controller.policy import Rule, Tier
from ftrun.errors import UsageError
from ftrun.timeouts import FLAGS as TIMEOUT_KEYS

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

RULE_KEYS = {"name", "tier", "kinds", "exit_codes", "signals", "exception", "log"}


@dataclass(frozen=True, kw_only=True)
class FaultPolicy:
    rules: tuple[Rule, ...] = ()
    quarantine: QuarantinePolicy = field(default_factory=QuarantinePolicy)
    hang: HangPolicy = field(default_factory=HangPolicy)
    # [timeouts]: only the keys the file sets; flags beat them, and LaunchConfig checks them.
    timeouts: dict[str, float] = field(default_factory=dict)


# What each section looks like, for messages that say what was expected: `[hang]: expected a
# table like `[hang] floor_s = 2`, got the integer 5`.
EXAMPLES = {
    "rules": '[[rules]] tier = "fatal"',
    "quarantine": "[quarantine] failures = 3",
    "hang": "[hang] floor_s = 2",
    "timeouts": "[timeouts] host_lost_timeout_s = 1.0",
}
# The numbers in [quarantine] and [hang]: (kind, example). Counts are integers, times and factors
# any non-negative number; expect_progress is a boolean.
NUMBERS = {
    "failures": ("a non-negative integer", "3"),
    "window_s": ("a non-negative number of seconds", "600"),
    "expiry_s": ("a non-negative number of seconds", "3600"),
    "startup_timeout_s": ("a non-negative number of seconds", "300"),
    "floor_s": ("a non-negative number of seconds", "2"),
    "factor": ("a non-negative number", "5"),
    "busy_floor_s": ("a non-negative number of seconds", "60"),
    "confirm_s": ("a non-negative number of seconds", "1"),
}


def load_policy(path: str | Path) -> FaultPolicy:
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"no policy file {str(path)!r}", hint="check the --policy path") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(
            f"cannot read the policy file {path}: {e}", hint="check the --policy path"
        ) from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(
            f"the policy file {path} is not valid TOML: {e}",
            hint="see docs/policy.md for the format",
        ) from None
    return policy_from_dict(data, where=f"the policy file {path}")


def policy_from_dict(data: dict[str, Any], *, where: str = "the policy") -> FaultPolicy:
    """A parsed policy file → FaultPolicy, every problem (with the key, the type expected and an
    example) collected into one UsageError."""
    problems: list[str] = []
    unknown = set(data) - set(EXAMPLES)
    if unknown:
        problems.append(f"unknown section(s) {sorted(unknown)}; known: {sorted(EXAMPLES)}")
    raw_rules = data.get("rules", [])
    if not isinstance(raw_rules, list):
        problems.append(
            _expected("rules", "an array of tables like " + EXAMPLES["rules"], raw_rules)
        )
        raw_rules = []
    rules = tuple(
        r for i, raw in enumerate(raw_rules) if (r := _rule(i, raw, problems)) is not None
    )
    quarantine = _section(QuarantinePolicy, data.get("quarantine", {}), "quarantine", problems)
    hang_raw = data.get("hang", {})
    if isinstance(hang_raw, dict) and "startup_timeout_s" in hang_raw:
        hang_raw = {**hang_raw, "expect_progress": hang_raw.get("expect_progress", True)}
    hang = _section(HangPolicy, hang_raw, "hang", problems)
    timeouts = _timeouts(data.get("timeouts", {}), problems)
    if problems:
        raise UsageError(
            f"{where} has problems: " + "; ".join(problems),
            hint="see docs/policy.md for the policy file format",
        )
    return FaultPolicy(rules=rules, quarantine=quarantine, hang=hang, timeouts=timeouts)


def _describe(value: Any) -> str:
    """`the integer 5`, `the string 'x'`: a TOML value as a message shows it."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {value[:40]!r}" + ("..." if len(value) > 40 else "")
    if isinstance(value, list):
        return f"an array of {len(value)}"
    if isinstance(value, dict):
        return "a table"
    return f"the {type(value).__name__} {str(value)[:40]}"  # TOML dates and times


def _expected(key: str, expected: str, got: Any) -> str:
    return f"{key}: expected {expected}, got {_describe(got)}"


def _timeouts(raw: Any, problems: list[str]) -> dict[str, float]:
    if not isinstance(raw, dict):
        problems.append(_expected("[timeouts]", "a table like " + EXAMPLES["timeouts"], raw))
        return {}
    unknown = set(raw) - set(TIMEOUT_KEYS)
    if unknown:
        problems.append(
            f"[timeouts] has unknown key(s) {sorted(unknown)}; known: {sorted(TIMEOUT_KEYS)}"
        )
    out = {}
    for key in TIMEOUT_KEYS:
        if key in raw:
            value = raw[key]
            if not numbers.is_number(value) or not 0 <= value < float("inf"):
                problems.append(
                    _expected(
                        f"[timeouts].{key}", "a non-negative number of seconds like 1.0", value
                    )
                )
            else:
                out[key] = float(value)
    return out


def _strings(where: str, raw: Any, example: str, problems: list[str]) -> tuple[str, ...]:
    """A string, or an array of strings (`kinds = "hang"` or `kinds = ["hang", "crash"]`)."""
    values = _as_list(raw)
    if not all(isinstance(v, str) for v in values):
        problems.append(_expected(where, f"a string or an array of strings like {example}", raw))
        return ()
    return tuple(values)


def _rule(index: int, raw: Any, problems: list[str]) -> Rule | None:
    where = f"rules[{index}]"
    if not isinstance(raw, dict):
        problems.append(_expected(where, "a table like " + EXAMPLES["rules"], raw))
        return None
    unknown = set(raw) - RULE_KEYS
    if unknown:
        problems.append(f"{where} has unknown key(s) {sorted(unknown)}; known: {sorted(RULE_KEYS)}")
    tiers = [t.value for t in Tier]
    tier: Tier | None = None
    if isinstance(raw.get("tier"), str) and raw["tier"] in tiers:
        tier = Tier(raw["tier"])
    else:
        problems.append(
            f"{where}.tier must be one of {tiers}"
            + ("" if "tier" not in raw else f", got {_describe(raw['tier'])}")
        )
    name = raw.get("name", where)
    if not isinstance(name, str):
        problems.append(_expected(f"{where}.name", 'a string like "bad shard is fatal"', name))
    kinds = _strings(f"{where}.kinds", raw.get("kinds", []), '["crash", "hang"]', problems)
    if any(k not in KINDS for k in kinds):
        problems.append(f"{where}.kinds must be among {list(KINDS)}")
    for key in ("exception", "log"):
        if key in raw:
            if not isinstance(raw[key], str):
                problems.append(_expected(f"{where}.{key}", 'a regex like "CUDA error"', raw[key]))
                continue
            try:
                re.compile(raw[key])
            except (re.error, RecursionError, OverflowError) as e:
                problems.append(f"{where}.{key} is not a valid regex: {e}")
    codes = _as_list(raw.get("exit_codes", []))
    if not all(isinstance(c, int) and not isinstance(c, bool) for c in codes):
        problems.append(
            _expected(
                f"{where}.exit_codes", "an integer or an array like [7, 9]", raw["exit_codes"]
            )
        )
        codes = []
    signals = _strings(f"{where}.signals", raw.get("signals", []), '["SIGKILL", "TERM"]', problems)
    if tier is None or not isinstance(name, str):
        return None
    return Rule(
        name=name,
        tier=tier,
        kinds=kinds,
        exit_codes=tuple(codes),
        signals=tuple(
            s.upper() if s.upper().startswith("SIG") else f"SIG{s.upper()}" for s in signals
        ),
        exception=raw.get("exception") if isinstance(raw.get("exception"), str) else None,
        log=raw.get("log") if isinstance(raw.get("log"), str) else None,
    )


def _section(cls: type, raw: Any, where: str, problems: list[str]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    if not isinstance(raw, dict):
        problems.append(_expected(f"[{where}]", "a table like " + EXAMPLES[where], raw))
        return cls()
    unknown = set(raw) - names
    if unknown:
        problems.append(f"[{where}] has unknown key(s) {sorted(unknown)}; known: {sorted(names)}")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in names:
            continue
        if key == "expect_progress":
            if isinstance(value, bool):
                values[key] = value
            else:
                problems.append(_expected(f"[{where}].{key}", "true or false", value))
            continue
        kind, example = NUMBERS[key]
        integer = kind.endswith("integer")
        ok = (
            (isinstance(value, int) and not isinstance(value, bool))
            if integer
            else (numbers.is_number(value) and value < float("inf"))
        )
        if ok and value >= 0:
            values[key] = value
        else:
            problems.append(
                _expected(f"[{where}].{key}", f"{kind} like {key} = {example}", value)
                + (" (must be non-negative)" if ok else "")
            )
    return cls(**values)


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]
