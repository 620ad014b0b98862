"""A preemption notice while a generation runs: let the ranks commit a checkpoint, then stop.

Slurm sends the batch step (the controller) `--signal` seconds before a time limit, or before
preempting the job; the notice must become a committed checkpoint before the job goes down:

    notice ─▶ "preempt" to every agent: the flag file for ftrun.checkpoint (its next save is
      │       persisted at once), the signal to every rank (for a script's own handler)
      ├─ rank 0 reports the checkpoint committed at or after the notice's step ─┐
      ├─ the grace passes (a plain script never reports) ───────────────────────┤
      └─ the generation ends on its own (a fault, or the ranks exited) ─────────┴▶ Preempted

The watch goes on meanwhile (progress, output, faults) and the supervisor then tears the
generation down gracefully, journals it as an incident, and, with --requeue, asks Slurm to
requeue the job: the requeued batch step resumes the same job directory from the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from ftrun.config import LaunchConfig
from ftrun.controller.reporting import OutcomeState, Reporter
from ftrun.controller.server import ControlServer
from ftrun.journal import Journal
from ftrun.wire.inbound import CheckpointCommitted, Report

R = TypeVar("R")


@dataclass(frozen=True)
class Preempted:
    """What ended a watch under a preemption notice."""

    notice_t: float  # wall time of the notice
    signal: str
    step_at_notice: int | None
    committed_step: int | None  # the checkpoint committed for it; None: none reported in time
    why: str


class PreemptWait:
    """One notice being honoured: the deadline, and the commit that ends it early."""

    def __init__(
        self,
        config: LaunchConfig,
        *,
        server: ControlServer,
        journal: Journal,
        reporter: Reporter,
        gen: int,
        step: int | None,
        signal: str,
        since: tuple[float, float],
    ) -> None:
        """`since`: when the notice came (monotonic, wall): the grace counts from there."""
        self.notice_t = since[1]
        self.deadline = since[0] + config.preempt_grace_s
        self.gen, self.step, self.signal = gen, step, signal
        self.committed: int | None = None
        journal.record(
            "preempt_notice", gen=gen, signal=signal, step=step, grace_s=config.preempt_grace_s
        )
        reporter.notice(
            f"{signal}: preemption notice; ranks have {config.preempt_grace_s:g} s to commit "
            "a checkpoint",
            level="warning",
        )
        server.broadcast("preempt", gen=gen, signal=config.preempt_signal)

    def wake_at(self) -> float:
        return self.deadline

    def on_message(self, agent_id: str, msg: Report) -> Preempted | None:
        """Rank 0's commit report for the notice ends the wait. ftrun.checkpoint reports every
        commit; the notice's is marked `preempt` (its step is the script's save step, which
        need not count like the progress steps)."""
        if not isinstance(msg, CheckpointCommitted) or msg.gen != self.gen:
            return None
        if not msg.preempt:
            return None  # an ordinary commit, from before the notice reached the ranks
        step = msg.step
        if msg.rank != 0 or not isinstance(step, int):
            return None
        self.committed = step
        return self.result(f"checkpoint of step {step} committed")

    def expired(self, now: float) -> Preempted | None:
        if now < self.deadline:
            return None
        return self.result("no checkpoint reported committed within the grace")

    def result(self, why: str) -> Preempted:
        return Preempted(self.notice_t, self.signal, self.step, self.committed, why)


def under(preempt: PreemptWait | None, result: R) -> R | Preempted:
    """What ends a watch, under a preemption notice: whatever else ended it ends it as the
    preemption (the job is going down anyway), except a stop. Also every rank exiting 0: a
    script's own handler saves and exits on the notice, and the requeued job must go on from
    there (a job that had really finished restores and exits at once)."""
    if preempt is None or result is OutcomeState.STOPPED or isinstance(result, Preempted):
        return result
    if result is OutcomeState.SUCCEEDED:
        return preempt.result("every rank exited 0 after the notice")
    return preempt.result("the generation ended before a checkpoint was reported")
