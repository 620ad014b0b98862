"""Fault policy: evidence about a failure → the tier that handles it. Pure, no I/O.

Tiers (DESIGN.md §5):
  restart-in-place  the host is fine and the failure looks transient: same hosts, next generation.
  replace-node      the host is lost or unhealthy: needs a spare or a shrink (multi-host).
  fatal             the job itself is wrong, or the budget is spent: stop and name the root cause.

Rules, first match wins:
  1. host lost                                          → replace-node
  2. a deterministic error (import, syntax, bad arguments) before the job's first step → fatal
  3. the same failure as the previous one, with no step progress in between          → fatal
  4. restart budget spent                                                             → fatal
  5. anything else                                                                    → restart-in-place
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# Exceptions that a restart cannot fix when they happen before training starts.
DETERMINISTIC_EXCEPTIONS = frozenset({
    "ImportError", "ModuleNotFoundError", "SyntaxError", "IndentationError", "TabError",
    "NameError", "AttributeError", "TypeError", "FileNotFoundError", "PermissionError",
})


class Tier(str, enum.Enum):
    RESTART_IN_PLACE = "restart-in-place"
    REPLACE_NODE = "replace-node"
    FATAL = "fatal"


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """What the controller knows about one failure."""

    kind: str  # "crash" (a rank or torchrun exited badly) or "host-lost"
    host: str | None = None
    rank: int | None = None
    exit_code: int | None = None
    signal: str | None = None
    exception: str | None = None  # the last line of the traceback, e.g. "ValueError: boom"
    usage_error: bool = False  # argparse-style "usage:" output with exit code 2
    step: int | None = None  # the last step the job reported before the failure

    @property
    def exception_type(self) -> str | None:
        if not self.exception:
            return None
        head = self.exception.split(":", 1)[0].strip()
        return head.rsplit(".", 1)[-1] or None

    def signature(self) -> tuple[object, ...]:
        return (self.kind, self.rank, self.exit_code, self.signal, self.exception, self.step)

    def describe(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "torchrun"
        if self.kind == "host-lost":
            return f"host {self.host} was lost"
        how = f"signal {self.signal}" if self.signal else f"exit code {self.exit_code}"
        text = f"{who} on {self.host} died with {how}"
        if self.exception:
            text += f": {self.exception}"
        return text


@dataclass(frozen=True, kw_only=True)
class History:
    """What came before this failure, as the policy needs it."""

    restarts_used: int = 0
    ever_progressed: bool = False
    previous: Evidence | None = None
    progressed_since_previous: bool = False


@dataclass(frozen=True)
class Decision:
    tier: Tier
    reason: str


def classify(evidence: Evidence, history: History, *, max_restarts: int) -> Decision:
    if evidence.kind == "host-lost":
        return Decision(Tier.REPLACE_NODE, f"{evidence.describe()}; it needs a replacement")
    if not history.ever_progressed and (
            evidence.exception_type in DETERMINISTIC_EXCEPTIONS or evidence.usage_error):
        what = evidence.exception or "a usage error (exit code 2)"
        return Decision(Tier.FATAL, f"failed before its first step with {what}; "
                                    "a restart would fail the same way")
    if (history.previous is not None and not history.progressed_since_previous
            and history.previous.signature() == evidence.signature()):
        return Decision(Tier.FATAL, f"the same failure twice with no progress in between: "
                                    f"{evidence.describe()}")
    if history.restarts_used >= max_restarts:
        return Decision(Tier.FATAL, f"restart budget spent ({max_restarts} restarts): "
                                    f"{evidence.describe()}")
    return Decision(Tier.RESTART_IN_PLACE, f"{evidence.describe()}; restarting in place")


def backoff_s(failures_without_progress: int, *, base_s: float, cap_s: float) -> float:
    """Delay before the next restart: the first is immediate (a one-off fault should cost no
    extra time), later ones in a row without progress back off exponentially up to a cap."""
    if failures_without_progress <= 1:
        return 0.0
    return min(cap_s, base_s * 2 ** (failures_without_progress - 2))
