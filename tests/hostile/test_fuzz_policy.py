"""Fuzzing the policy file (`ftrun launch --policy FILE`): TOML written from arbitrary tables of
arbitrary values, near the real keys and far from them, and arbitrary bytes. `load_policy`
returns a FaultPolicy whose fields have their declared types, or raises one UsageError that
names the problems; nothing else."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ftrun.controller.policy import Rule, Tier
from ftrun.controller.policy_file import RULE_KEYS, FaultPolicy, load_policy
from ftrun.errors import UsageError

FUZZ = settings(max_examples=150, deadline=None)

SCALAR = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["fatal", "restart-in-place", "crash", "hang", "SIGKILL", "(", ".*"]),
)
VALUE = st.recursive(
    SCALAR,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
KEYS = sorted(
    RULE_KEYS
    | {"failures", "window_s", "expiry_s", "startup_timeout_s", "floor_s", "factor"}
    | {"expect_progress", "heartbeat_interval_s", "host_lost_timeout_s", "fence_timeout_s"}
)
NEAR_TABLE = st.dictionaries(
    st.one_of(st.sampled_from(KEYS), st.text(max_size=8)), VALUE, max_size=6
)
SECTION = st.one_of(VALUE, NEAR_TABLE, st.lists(NEAR_TABLE, max_size=3))
POLICY = st.dictionaries(
    st.one_of(st.sampled_from(["rules", "quarantine", "hang", "timeouts"]), st.text(max_size=8)),
    SECTION,
    max_size=4,
)


def toml_value(value: Any) -> str:
    """TOML for a value, inline (the file is `key = value` lines; inline tables nest)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{toml_string(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_string(text: str) -> str:
    safe = (c if " " <= c <= "~" and c not in '"\\' else f"\\U{ord(c):08X}" for c in text)
    return '"' + "".join(safe) + '"'


def check(policy: FaultPolicy) -> None:
    for rule in policy.rules:
        assert isinstance(rule, Rule) and isinstance(rule.name, str) and isinstance(rule.tier, Tier)
        assert all(isinstance(x, str) for x in (*rule.kinds, *rule.signals))
        assert all(isinstance(c, int) for c in rule.exit_codes)
    for value in (
        policy.quarantine.failures,
        policy.quarantine.window_s,
        policy.quarantine.expiry_s,
        policy.hang.floor_s,
        policy.hang.factor,
        *policy.timeouts.values(),
    ):
        assert isinstance(value, (int, float)) and not isinstance(value, bool)
        assert 0 <= value < math.inf
    assert isinstance(policy.hang.expect_progress, bool)


def load(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "policy.toml"
        path.write_bytes(data)
        try:
            check(load_policy(path))
        except UsageError as e:
            assert e.message.startswith(("the policy file", "cannot read the policy file"))
            assert e.hint


@FUZZ
@given(POLICY)
def test_policy_from_arbitrary_tables(data: dict[str, Any]):
    load("".join(f"{toml_string(k)} = {toml_value(v)}\n" for k, v in data.items()).encode())


@FUZZ
@given(st.binary(max_size=300))
def test_policy_from_arbitrary_bytes(data: bytes):
    load(data)


def test_the_serializer_round_trips():
    """The TOML written above is what it says (else the fuzz would test the parser's errors)."""
    from ftrun.controller.policy_file import tomllib

    data = {"hang": {"floor_s": 1.5, "x\u202e": [1, 'a"b']}, "rules": [{"tier": "fatal"}]}
    text = "".join(f"{toml_string(k)} = {toml_value(v)}\n" for k, v in data.items())
    assert tomllib.loads(text) == data
