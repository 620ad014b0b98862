"""The language in which messages.py writes what each role may say: a field's type and bounds
(Int, Num, Bool, Str, ListOf, ByRank, Json), the fields most kinds share (a generation, a rank,
a step, a wall-clock time…), and the Schema of one kind.

Each field's `check` returns why a value is not one, or None: the reason goes into the
ProtocolError that drops the message, so a refusal says which field was wrong and how. The
bounds are far above any honest message, and keep one message from costing much to hold.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Bounds that no honest message comes near (reports are clipped at their source, see
# agent/rank_evidence.py), and that keep one message from costing the controller much to hold.
MAX_TEXT = 256 * 1024  # a traceback, a stack dump
MAX_LINE = 64 * 1024  # one log line, one exception line
MAX_NAME = 512  # a host, an agent id, a signal or action name
MAX_LINES = 10_000  # a batch of log lines, a tail
MAX_RANKS = 1 << 20
MAX_PID = 1 << 32
MAX_STEP = 1 << 62
RANK_KEY = re.compile(r"\d{1,7}")


class Field:
    """A field's type and bounds; `check` returns a reason when the value is not one."""

    nullable = False

    def check(self, value: Any) -> str | None:
        if value is None:
            return None if self.nullable else "is null"
        return self._check(value)

    def _check(self, value: Any) -> str | None:
        raise NotImplementedError


@dataclass(frozen=True)
class Int(Field):
    lo: int = 0
    hi: int = MAX_STEP
    nullable: bool = False

    def _check(self, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"is not an integer ({type(value).__name__})"
        if not self.lo <= value <= self.hi:
            return f"{value} is out of range {self.lo}..{self.hi}"
        return None


@dataclass(frozen=True)
class Num(Field):
    lo: float = 0.0
    hi: float = 1e12
    nullable: bool = False

    def _check(self, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"is not a number ({type(value).__name__})"
        if not math.isfinite(value) or not self.lo <= value <= self.hi:
            return f"{value} is out of range {self.lo:g}..{self.hi:g}"
        return None


@dataclass(frozen=True)
class Bool(Field):
    nullable: bool = False

    def _check(self, value: Any) -> str | None:
        return None if isinstance(value, bool) else f"is not a boolean ({type(value).__name__})"


@dataclass(frozen=True)
class Str(Field):
    max_len: int = MAX_NAME
    nullable: bool = False
    pattern: re.Pattern[str] | None = None
    choices: tuple[str, ...] = ()

    def _check(self, value: Any) -> str | None:
        if not isinstance(value, str):
            return f"is not a string ({type(value).__name__})"
        if len(value) > self.max_len:
            return f"is {len(value)} characters, over {self.max_len}"
        if self.choices and value not in self.choices:
            return f"{value[:40]!r} is not one of {', '.join(self.choices)}"
        if self.pattern is not None and not self.pattern.fullmatch(value):
            return f"{value[:40]!r} is not a plain name"
        return None


@dataclass(frozen=True)
class ListOf(Field):
    item: Field
    max_items: int = MAX_LINES
    nullable: bool = False

    def _check(self, value: Any) -> str | None:
        if not isinstance(value, list):
            return f"is not a list ({type(value).__name__})"
        if len(value) > self.max_items:
            return f"has {len(value)} items, over {self.max_items}"
        for i, item in enumerate(value):
            if (why := self.item.check(item)) is not None:
                return f"item {i} {why}"
        return None


@dataclass(frozen=True)
class ByRank(Field):
    """A map from a rank (as a decimal string: JSON keys are strings) to a value."""

    value: Field
    nullable: bool = False

    def _check(self, value: Any) -> str | None:
        if not isinstance(value, dict):
            return f"is not an object ({type(value).__name__})"
        if len(value) > MAX_RANKS:
            return f"has {len(value)} entries, over {MAX_RANKS}"
        for k, v in value.items():
            if not RANK_KEY.fullmatch(k):
                return f"key {k[:40]!r} is not a rank"
            if (why := self.value.check(v)) is not None:
                return f"[{k}] {why}"
        return None


@dataclass(frozen=True)
class Json(Field):
    """Any JSON value: for what the controller passes through opaquely (the launch spec)."""

    nullable: bool = True

    def _check(self, value: Any) -> str | None:
        return None


def opt(field: Field) -> Field:
    """The same field, null allowed."""
    return type(field)(**{**field.__dict__, "nullable": True})


GEN = Int(0, 1 << 31)
OSEQ = Int(1, 1 << 62)  # an agent's output messages over its life (agent/unacked.py)
RANK = Int(0, MAX_RANKS)
STEP = Int(-1, MAX_STEP)
PID = Int(0, MAX_PID)
WALL_T = Num(0.0, 1e11)  # a wall-clock time (seconds since the epoch)
SECONDS = Num(0.0, 1e9)
PORT = Int(0, 65535)
SIGNAL = Str(32)
LINES = ListOf(Str(MAX_LINE))
TEXT = Str(MAX_TEXT)
EXIT_CODE = Int(-(1 << 31), 1 << 31)
PEER_SOURCES = ("primary", "replica")  # a rank's own memory tier, or the copy a peer keeps
CHAOS_ACTIONS = ("kill-rank", "hang-rank", "kill-agent", "freeze-agent")


@dataclass(frozen=True)
class Schema:
    fields: Mapping[str, Field]
    required: tuple[str, ...] = ()
    open: bool = False  # other fields pass unchecked (only for what the controller sends)
