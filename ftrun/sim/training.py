"""A simulated generation's training: the step it has reached, and the step storage holds.

Steps are counted, not run: a generation that began training at `t0` on step `step0` has reached
step0 + (t - t0) / step_s, its step time its plan's or, unplanned (DP, the global batch kept),
the original hosts' scaled to the ranks it has. What storage holds of it is charges.py's (ftrun
persists all the time, the baseline saves every interval); the last commit outlives its
generation: the next one restores it.
"""

from __future__ import annotations

from ftrun.journal import Journal
from ftrun.planner import Layout
from ftrun.sim.charges import Charges


class Training:
    def __init__(self, charges: Charges, *, full_world: int) -> None:
        self.charges = charges
        self.full_world = full_world  # the ranks of the job's original hosts
        self.t0 = 0.0  # training of the running generation began here, at step0
        self.step0 = 0
        self.step_s = charges.costs.step_s
        self.committed = 0  # the last step committed to storage

    def launched(self, world: int, plan: Layout | None) -> None:
        """A generation of `world` ranks launched, on `plan` when the job is planned."""
        if plan is not None:
            self.step_s = float(plan.step_s)
        else:
            self.step_s = self.charges.costs.step_s * self.full_world / max(1, world)

    def began(self, t: float, *, step0: int) -> None:
        self.t0, self.step0 = t, step0

    def reached(self, t: float) -> int:
        """The step reached at `t` (the last whole one)."""
        return self.step0 + int((t - self.t0) / self.step_s)

    def record(self, journal: Journal, *, t: float, gen: int, step: int) -> None:
        """A progress event at `t`, after the commit storage got since the last one, if any."""
        at = self.charges.committed_s(t - self.t0)
        if at > 0:
            commit_step = self.step0 + int(at / self.step_s)
            if commit_step > self.committed:
                self.committed = commit_step
                journal.record("checkpoint_committed", gen=gen, step=commit_step)
        journal.record("progress", gen=gen, step=step, stall_s=self.charges.stall_s(t - self.t0))
