"""Fault policy: evidence about a failure → the tier that handles it. Pure, no I/O.

Three tiers, from cheapest to final:
  restart-in-place  the host is fine and the failure looks transient: same hosts, next generation.
  replace-node      the host is lost or unhealthy: it needs a spare or a shrink.
  fatal             the job itself is wrong, or the budget is spent: stop and name the root cause.

A failure is first matched against the rules, the user's (from --policy FILE) before the
defaults below; the first rule that matches proposes a tier. A proposed restart then passes the
guards, any of which makes it fatal:
  - a deterministic error (import, syntax, bad arguments) before the job's first step;
  - the same failure as the previous one, with no step progress in between;
  - the restart budget spent.
One exception to the second: when both failures came right after a restore of the same step N
(the checkpoint itself may be bad: NaN weights, a torn state), the restore is rejected instead
(rule `restore rejected`): one more restart, charged to the budget, whose ranks restore a checkpoint
older than N (Decision.restore_before; ftrun.checkpoint honours it). Only a third same failure
after that older restore is fatal.
A failure after a rank of the generation exited 0 is never restarted: the generation's work is
done (see controller/stall.py), so it ends the job, failed.
What the evidence is comes from evidence.py; host history (repeated failures on one host →
quarantine) is host_health.py's.
"""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass

from ftrun.controller.evidence import Evidence

# Exceptions that a restart cannot fix when they happen before training starts.
DETERMINISTIC_EXCEPTIONS = frozenset(
    {
        "ImportError",
        "ModuleNotFoundError",
        "SyntaxError",
        "IndentationError",
        "TabError",
        "NameError",
        "AttributeError",
        "TypeError",
        "FileNotFoundError",
        "PermissionError",
    }
)


class Tier(str, enum.Enum):
    RESTART_IN_PLACE = "restart-in-place"
    REPLACE_NODE = "replace-node"
    FATAL = "fatal"


@dataclass(frozen=True, kw_only=True)
class Rule:
    """Evidence → tier. Every field given must match (regexes use re.search); none given: all."""

    name: str
    tier: Tier
    kinds: tuple[str, ...] = ()
    exit_codes: tuple[int, ...] = ()
    signals: tuple[str, ...] = ()
    exception: str | None = None  # regex on the exception line
    log: str | None = None  # regex on the last lines of the rank's log

    def matches(self, ev: Evidence) -> bool:
        if self.kinds and ev.kind not in self.kinds:
            return False
        if self.exit_codes and ev.exit_code not in self.exit_codes:
            return False
        if self.signals and ev.signal not in self.signals:
            return False
        if self.exception and not (ev.exception and _regex(self.exception).search(ev.exception)):
            return False
        if self.log and not any(_regex(self.log).search(line) for line in ev.log_tail):
            return False
        return True


@functools.lru_cache(maxsize=256)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


DEFAULT_RULES: tuple[Rule, ...] = (
    Rule(name="host lost", tier=Tier.REPLACE_NODE, kinds=("host-lost",)),
    Rule(
        name="GPU hardware fault",
        tier=Tier.REPLACE_NODE,
        log=r"uncorrectable ECC error|GPU has fallen off the bus|\bXid\b|NVLink error|"
        r"CUDA error: (an illegal memory access|unspecified launch failure)",
    ),
    Rule(name="hang", tier=Tier.RESTART_IN_PLACE, kinds=("hang",)),
    Rule(
        name="communication error",
        tier=Tier.RESTART_IN_PLACE,
        log=r"NCCL error|ProcessGroupNCCL|DistBackendError|Connection (closed|reset) by peer",
    ),
    Rule(
        name="out of memory",
        tier=Tier.RESTART_IN_PLACE,
        log=r"CUDA out of memory|OutOfMemoryError|Cannot allocate memory",
    ),
    Rule(
        name="killed by a signal",
        tier=Tier.RESTART_IN_PLACE,
        signals=("SIGKILL", "SIGTERM", "SIGSEGV", "SIGBUS", "SIGABRT", "SIGINT"),
    ),
    Rule(name="any other failure", tier=Tier.RESTART_IN_PLACE),
)


@dataclass(frozen=True, kw_only=True)
class History:
    """What came before this failure, as the policy needs it."""

    restarts_used: int = 0
    ever_progressed: bool = False
    previous: Evidence | None = None
    progressed_since_previous: bool = False
    # The rank that exited 0 in this generation, if one did: its work is done, no restart.
    work_done_by: int | None = None
    # The step this generation restored, and the one the generation of `previous` restored
    # (None: no restore reported, or nothing to restore).
    restored_step: int | None = None
    previous_restored_step: int | None = None


RESTORE_REJECTED = "restore rejected"


@dataclass(frozen=True)
class Decision:
    tier: Tier
    reason: str
    rule: str = ""
    # A restart whose ranks must restore a checkpoint older than this step (restore rejected).
    restore_before: int | None = None


def classify(
    evidence: Evidence, history: History, *, max_restarts: int, rules: tuple[Rule, ...] = ()
) -> Decision:
    rule = next(r for r in (*rules, *DEFAULT_RULES) if r.matches(evidence))
    what = evidence.describe()
    if rule.tier is Tier.FATAL:
        return Decision(Tier.FATAL, f"{what} ({rule.name}: fatal by policy)", rule.name)
    if history.work_done_by is not None:
        return Decision(
            Tier.FATAL,
            f"{what} after rank {history.work_done_by} had exited 0: "
            "the generation's work is done, so it is not restarted",
            "work done",
        )
    if rule.tier is Tier.REPLACE_NODE:
        return Decision(
            Tier.REPLACE_NODE, f"{what} ({rule.name}); it needs a replacement", rule.name
        )
    if not history.ever_progressed and (
        evidence.exception_type in DETERMINISTIC_EXCEPTIONS or evidence.usage_error
    ):
        failure = evidence.exception or "a usage error (exit code 2)"
        return Decision(
            Tier.FATAL,
            f"failed before its first step with {failure}; a restart would fail the same way",
            "before first step",
        )
    if (
        history.previous is not None
        and not history.progressed_since_previous
        and history.previous.signature() == evidence.signature()
    ):
        step = history.restored_step
        if step and step == history.previous_restored_step:
            if history.restarts_used >= max_restarts:
                return Decision(
                    Tier.FATAL,
                    f"restart budget spent ({max_restarts} restarts): {what}, twice right after "
                    f"restoring step {step}",
                    "restart budget",
                )
            return Decision(
                Tier.RESTART_IN_PLACE,
                f"the same failure twice right after restoring step {step}: {what}; the "
                f"checkpoint of step {step} is rejected, restarting from an older one",
                RESTORE_REJECTED,
                restore_before=step,
            )
        return Decision(
            Tier.FATAL,
            f"the same failure twice with no progress in between: {what}",
            "same failure twice",
        )
    if history.restarts_used >= max_restarts:
        return Decision(
            Tier.FATAL, f"restart budget spent ({max_restarts} restarts): {what}", "restart budget"
        )
    return Decision(Tier.RESTART_IN_PLACE, f"{what}; restarting in place", rule.name)


def backoff_s(failures_without_progress: int, *, base_s: float, cap_s: float) -> float:
    """Delay before the next restart: the first is immediate (a one-off fault should cost no
    extra time), later ones in a row without progress back off exponentially up to a cap."""
    if failures_without_progress <= 1:
        return 0.0
    return min(cap_s, base_s * 2 ** (failures_without_progress - 2))
