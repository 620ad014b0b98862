"""Checkpoint-restart, the baseline a simulation measures ftrun against: torchrun elastic.

It runs through the same engine (engine.py) with its own behaviour: DP only (DataParallelOnly),
every change of hosts restarts the job, and a restart restores the last checkpoint, written
every `checkpoint_every_s` (Baseline: its figures; charges.py charges them). The baseline is given
its best checkpoint interval (young_daly_interval_s), so that ftrun is measured against
checkpoint-restart done well.
"""

from __future__ import annotations

from dataclasses import dataclass

from ftrun.controller.planning import PlanDesk
from ftrun.planner import Layout, SwitchDecision


@dataclass(frozen=True, kw_only=True)
class Baseline:
    """Checkpoint-restart as torchrun elastic does it: what differs from ftrun."""

    detect_s: float  # torchelastic notices a lost node (rendezvous keep-alive, ~15 s)
    restart_s: float  # rendezvous again and start every worker
    checkpoint_every_s: float  # DCP to storage this often, from the first step of a generation
    checkpoint_stall_s: float  # what each save stalls training


def young_daly_interval_s(checkpoint_stall_s: float, mean_time_between_changes_s: float) -> float:
    """The checkpoint interval that loses least to saves and restarts together:
    sqrt(2 * save cost * mean time between failures) (Young 1974, Daly 2006). The baseline is
    given its best interval, so that ftrun is measured against checkpoint-restart done well."""
    return max(1.0, (2.0 * checkpoint_stall_s * mean_time_between_changes_s) ** 0.5)


class DataParallelOnly(PlanDesk):
    """The baseline's planner: torchrun elastic re-forms data parallelism only, so of the
    layouts the planner ranks it may take those without a pipeline. Its "smaller plan" is
    still measured against the best layout of all (`full_step_s`)."""

    def ranked(self, n_hosts: int) -> list[Layout]:
        return [layout for layout in super().ranked(n_hosts) if layout.pp == 1]

    def full_step_s(self, n_hosts: int, ranked: list[Layout]) -> float | None:
        want = self.config.max_nodes or len(self.config.hosts)
        return super().full_step_s(want, PlanDesk.ranked(self, want))  # every layout, not ours

    def worth_growing(self, active: list[str], joining: list[str]) -> SwitchDecision | None:
        """A node that joins restarts the workers, whether it pays or not; a host its plan
        leaves idle is no membership change."""
        candidate = self.ranked(len(active) + len(joining))
        if not candidate or (self.current is not None and candidate[0].same_plan(self.current)):
            return None
        return SwitchDecision(switch=True, reason="a node joined: torchrun restarts", gain_s=0.0)
