"""What the controller knows about a failure, and how agents' messages become it.

`Evidence` is what the fault policy (policy.py) classifies: the kind of failure, where, and
its signature. A `Failure` is evidence with what the journal needs beside it: when the fault
happened, when it was detected, tracebacks, stacks, log tails. The functions below build one
from each kind of report (a rank's crash or hang, torchrun's exit, a lost host, an idle job).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ftrun.controller.stall import Idle
from ftrun.wire.inbound import AgentLost, GenExited, RankExited, RankHung

HOST_LOST = "host-lost"
KINDS = ("crash", "hang", HOST_LOST)


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """What the controller knows about one failure."""

    kind: str  # one of KINDS
    host: str | None = None
    rank: int | None = None
    exit_code: int | None = None
    signal: str | None = None
    exception: str | None = None  # the last line of the traceback, e.g. "ValueError: boom"
    usage_error: bool = False  # argparse-style "usage:" output with exit code 2
    step: int | None = None  # the last step the job reported before the failure
    log_tail: tuple[str, ...] = ()
    note: str | None = None  # how it was detected, when that is worth saying (not compared)

    @property
    def exception_type(self) -> str | None:
        if not self.exception:
            return None
        head = self.exception.split(":", 1)[0].strip()
        return head.rsplit(".", 1)[-1] or None

    def signature(self) -> tuple[object, ...]:
        """What makes two failures the same. Not the rank: when every rank runs the same code
        into the same error (a missing backend, a bad config), which of them is reported first
        is a race, and telling the failures apart by it restarted a script that could not start
        until the host's quarantine, which then blamed the host."""
        return (self.kind, self.exit_code, self.signal, self.exception, self.step)

    def describe(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "torchrun"
        if self.kind == "host-lost":
            return f"host {self.host} was lost"
        if self.kind == "hang":
            at = f" after step {self.step}" if self.step is not None else " before its first step"
            text = f"{who} on {self.host} hung{at}"
            return f"{text} ({self.note})" if self.note else text
        how = f"signal {self.signal}" if self.signal else f"exit code {self.exit_code}"
        text = f"{who} on {self.host} died with {how}"
        if self.exception:
            text += f": {self.exception}"
        return text


# Which injected chaos action explains which kind of fault.
INJECTED_KIND = {
    "kill-rank": "crash",
    "hang-rank": "hang",
    "kill-agent": "host-lost",
    "freeze-agent": "host-lost",
}


@dataclass
class Failure:
    evidence: Evidence
    fault_t: float | None  # when the fault happened, where known
    detected_t: float | None = None  # when it was detected, if not when the controller heard
    detail: dict[str, Any] = field(default_factory=dict)

    def attribute_injection(self, injected: dict[str, Any] | None) -> None:
        """An injected fault of the matching kind fixes the fault time exactly."""
        if injected and INJECTED_KIND.get(injected["action"]) == self.evidence.kind:
            self.fault_t = injected["t"]
            self.detail["injected"] = injected["action"]


def crash(msg: RankExited, host: str, step: int | None) -> Failure:
    tail = msg.tail or []
    return Failure(
        Evidence(
            kind="crash",
            host=host,
            rank=msg.rank,
            exit_code=msg.exit_code,
            signal=msg.signal,
            exception=msg.exception,
            usage_error=bool(msg.usage_error),
            step=step,
            log_tail=tuple(tail),
        ),
        fault_t=msg.t_exit,
        detail={
            "traceback": msg.traceback,
            "tail": tail,
            "traceback_source": msg.traceback_source,
        },
    )


def torchrun_exit(msg: GenExited, host: str, step: int | None, now: float) -> Failure:
    tail = msg.tail or []
    return Failure(
        Evidence(
            kind="crash",
            host=host,
            exit_code=msg.exit_code,
            exception=tail[-1] if tail else None,
            step=step,
            log_tail=tuple(tail),
        ),
        fault_t=now,
        detail={"tail": tail},
    )


# What the agent saw of a rank it judged hung (agent/verdict.py), as the incident says it.
HANG_NOTES = {
    "section": "past the timeout of the section it declared",
    "stopped": "stopped: the process is in state T (SIGSTOP or a debugger)",
    "spinning": "computing without a step past its allowance and the busy floor",
}


def hang(msg: RankHung, host: str, step: int | None) -> Failure:
    tail = msg.tail or []
    detected = msg.detected_t
    deadline = (msg.last_progress_t or 0.0) + (msg.allowance_s or 0.0)
    note = HANG_NOTES.get(str(msg.why))
    return Failure(
        Evidence(
            kind="hang",
            host=host,
            rank=msg.rank,
            step=step,
            log_tail=tuple(tail),
            note=note,
        ),
        fault_t=None,
        detected_t=detected,
        detail={
            "allowance_s": msg.allowance_s,
            "section": msg.section,
            "last_progress_t": msg.last_progress_t,
            "past_allowance_s": None if detected is None else round(detected - deadline, 3),
            "stacks": msg.stacks,
            "states": msg.states,
            "overdue_ranks": msg.overdue,
            "why": msg.why,
            "tail": tail,
        },
    )


def host_lost(lost: AgentLost | Mapping[str, Any], host: str, step: int | None) -> Failure:
    """A host lost: the server's AgentLost, or (the simulator's) a mapping with its reason."""
    heard_t: float | None  # when we last heard from the host
    reason: str | None
    if isinstance(lost, AgentLost):
        heard_t, reason = lost.last_heard_t, lost.reason
    else:
        heard_t, reason = lost.get("last_heard_t"), lost.get("reason")
    return Failure(
        Evidence(kind="host-lost", host=host, step=step),
        fault_t=heard_t,
        detail={"evidence": reason},
    )


def idle(found: Idle, hosts: dict[str, str], step: int | None, detected_t: float) -> Failure:
    """Every rank on every host idle for the window: a hang, named after the lowest rank (all of
    them stopped; the lowest is a stable name, so the same hang twice reads the same). With
    ranks past their allowance, a deadlock: named after the lowest of those."""
    pool = found.overdue or found.ranks
    rank = min(pool) if pool else None
    host = hosts.get(found.rank_agents.get(rank, ""), "?") if rank is not None else None
    if found.overdue:
        allowance = found.overdue[rank] if rank is not None else 0.0
        note = (
            f"past its {allowance:.1f} s allowance, and every rank waiting (no CPU, no output)"
            f" for {found.idle_s:.1f} s: nobody computes what they wait for"
        )
    else:
        note = f"idle: no CPU and no output for {found.idle_s:.0f} s"
    tail = found.tails.get(str(rank), []) if rank is not None else []
    return Failure(
        Evidence(kind="hang", host=host, rank=rank, step=step, log_tail=tuple(tail), note=note),
        fault_t=None,
        detected_t=detected_t,
        detail={
            "idle_s": round(found.idle_s, 3),
            "stacks": found.stacks,
            "states": found.states,
            "idle_ranks": {str(r): round(s, 3) for r, s in found.ranks.items()},
            "overdue_ranks": sorted(found.overdue),
            "allowance_s": found.overdue.get(rank) if rank is not None else None,
            "past_allowance_s": (
                round(detected_t - found.overdue_at[rank], 3)
                if rank is not None and rank in found.overdue_at
                else None
            ),
            "stacks_missing_from": sorted(hosts.get(a, a) for a in found.unanswered),
            "tail": tail,
        },
    )
