"""What a simulated job is charged: the time each phase of a recovery takes, and what its
checkpoints stall and keep; ftrun's measured figures (costs.py), or the baseline's where
checkpoint-restart differs (baseline.py).

The engine (engine.py) decides what happens with the controller's own code; this module is the
only place that says what it costs, so ftrun and the baseline differ here and nowhere else in
time.
"""

from __future__ import annotations

from dataclasses import dataclass

from ftrun.sim.baseline import Baseline
from ftrun.sim.costs import Costs


@dataclass(frozen=True)
class Charges:
    costs: Costs
    baseline: Baseline | None = None  # None: ftrun's own behaviour

    def startup_s(self) -> float:
        return self.baseline.restart_s if self.baseline else self.costs.startup_s

    def detect_s(self) -> float:
        return self.baseline.detect_s if self.baseline else self.costs.detect_s

    def teardown_s(self) -> float:
        return self.costs.teardown_s

    def relaunch_s(self) -> float:
        return self.baseline.restart_s if self.baseline else self.costs.relaunch_s

    def reconfigure_s(self) -> float:
        return self.costs.reconfigure_s

    def committed_s(self, trained_s: float) -> float:
        """How much of a generation's training, `trained_s` in, its newest commit holds."""
        # ftrun persists in the background, all the time: the newest commit is persist_lag_s
        # old (measured). The baseline saves every checkpoint_every_s: the last save's step.
        if self.baseline is None:
            return trained_s - self.costs.persist_lag_s
        every = self.baseline.checkpoint_every_s
        return (trained_s // every) * every

    def stall_s(self, trained_s: float) -> float:
        """What checkpoints have stalled a generation `trained_s` in: ftrun's snapshots a
        measured share of its training; the baseline's saves, each a full stall."""
        trained_s = max(0.0, trained_s)
        if self.baseline is None:
            return trained_s * self.costs.stall_share
        return (trained_s // self.baseline.checkpoint_every_s) * self.baseline.checkpoint_stall_s
