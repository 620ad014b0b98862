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
    problems: list[str] = []
    unknown = set(data) - {"rules", "quarantine", "hang", "timeouts"}
    if unknown:
        problems.append(f"unknown section(s) {sorted(unknown)}")
    rules = tuple(
        r
        for i, raw in enumerate(data.get("rules", []))
        if (r := _rule(i, raw, problems)) is not None
    )
    quarantine = _section(QuarantinePolicy, data.get("quarantine", {}), "quarantine", problems)
    hang_raw = dict(data.get("hang", {}))
    if "startup_timeout_s" in hang_raw:
        hang_raw["expect_progress"] = True
    hang = _section(HangPolicy, hang_raw, "hang", problems)
    timeouts = _timeouts(data.get("timeouts", {}), problems)
    if problems:
        raise UsageError(
            f"the policy file {path} has problems: " + "; ".join(problems),
            hint="see docs/policy.md for the format",
        )
    return FaultPolicy(rules=rules, quarantine=quarantine, hang=hang, timeouts=timeouts)


def _timeouts(raw: Any, problems: list[str]) -> dict[str, float]:
    if not isinstance(raw, dict):
        problems.append("[timeouts] is not a table")
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
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                problems.append(f"[timeouts].{key} must be a non-negative number of seconds")
            else:
                out[key] = float(value)
    return out


def _rule(index: int, raw: Any, problems: list[str]) -> Rule | None:
    where = f"rules[{index}]"
    if not isinstance(raw, dict):
        problems.append(f"{where} is not a table")
        return None
    unknown = set(raw) - RULE_KEYS
    if unknown:
        problems.append(f"{where} has unknown key(s) {sorted(unknown)}")
    try:
        tier = Tier(raw.get("tier"))
    except ValueError:
        problems.append(f"{where}.tier must be one of {[t.value for t in Tier]}")
        return None
    kinds = tuple(_as_list(raw.get("kinds", [])))
    if any(k not in KINDS for k in kinds):
        problems.append(f"{where}.kinds must be among {list(KINDS)}")
    for key in ("exception", "log"):
        if key in raw:
            try:
                re.compile(raw[key])
            except (re.error, TypeError) as e:
                problems.append(f"{where}.{key} is not a valid regex: {e}")
    try:
        exit_codes = tuple(int(c) for c in _as_list(raw.get("exit_codes", [])))
    except (TypeError, ValueError):
        problems.append(f"{where}.exit_codes must be integers")
        exit_codes = ()
    signals = tuple(
        s if str(s).startswith("SIG") else f"SIG{s}"
        for s in (str(x).upper() for x in _as_list(raw.get("signals", [])))
    )
    return Rule(
        name=str(raw.get("name", where)),
        tier=tier,
        kinds=kinds,
        exit_codes=exit_codes,
        signals=signals,
        exception=raw.get("exception"),
        log=raw.get("log"),
    )


def _section(cls: type, raw: Any, where: str, problems: list[str]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    if not isinstance(raw, dict):
        problems.append(f"[{where}] is not a table")
        return cls()
    unknown = set(raw) - names
    if unknown:
        problems.append(f"[{where}] has unknown key(s) {sorted(unknown)}")
    values = {k: v for k, v in raw.items() if k in names}
    for k, v in values.items():
        if k != "expect_progress" and (not isinstance(v, (int, float)) or v < 0):
            problems.append(f"[{where}].{k} must be a non-negative number")
    try:
        return cls(**values)
    except TypeError as e:
        problems.append(f"[{where}]: {e}")
        return cls()


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]
