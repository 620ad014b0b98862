"""What the plan desk learns from the job it runs (docs/planner.md, *A planner that learns*).

It follows the journal as it is written (`Journal.followers`): each generation's `first_step`
and `progress` events give its step rate (planner/calibrate.py's StepMeter), and once that is
steady the plan's factor (measured / predicted) is learned and journaled (`plan_calibrated`,
again with the final figure when the generation ends); a `link_check` (opt-in, before the first
generation or a host joining) gives the links' measured bandwidth and latency, used in place of
the defaults.

The measurement is the job's own throughput as the journal sees it — everything a step costs,
snapshots and stalls included — which is what a grow has to beat.
"""

from __future__ import annotations

import json
from typing import Any

from ftrun.journal import Journal
from ftrun.planner import Layout
from ftrun.planner.calibrate import Calibration, Measured, StepMeter

_KINDS = ('"kind":"first_step"', '"kind":"progress"', '"kind":"link_check"')


class PlanLearner:
    def __init__(self, journal: Journal, calibration: Calibration) -> None:
        self.journal = journal
        self.calibration = calibration
        self.gen: int | None = None
        self.layout: Layout | None = None  # the model's (uncalibrated) layout of `gen`
        self.summary = ""
        self.meter = StepMeter()
        self.told_steady = False
        # The link check's typical pair, (latency_s, bandwidth_Bps), once it ran.
        self.links: tuple[float | None, float | None] | None = None
        # First, so that a record made while following (plan_calibrated) reaches every other
        # follower (the standby's replica) in the order the file has it.
        journal.followers.insert(0, self.follow)

    def follow(self, line: str) -> None:
        """One journal event as written; never raises into the journal."""
        if not any(kind in line for kind in _KINDS):
            return
        try:
            ev: dict[str, Any] = json.loads(line)
            kind = ev["kind"]
            if kind == "link_check":
                self.links = (ev.get("typical_latency_s"), ev.get("typical_bandwidth_Bps"))
            elif ev.get("gen") == self.gen and isinstance(ev.get("step"), int):
                self.meter.sample(ev["step"], float(ev["t"]), first=kind == "first_step")
                if not self.told_steady:
                    self.current()  # journaled as soon as it is steady
        except (ValueError, KeyError, TypeError):
            return

    def start(self, gen: int, layout: Layout, summary: str) -> None:
        """Generation `gen` runs `layout`: the one before it is learned for good."""
        self.finish()
        self.gen, self.layout, self.summary = gen, layout, summary
        self.meter = StepMeter()
        self.told_steady = False

    def finish(self) -> None:
        if self.layout is not None and self.meter.steady():
            self._learn(final=True)
        self.layout = None

    def waiting(self) -> bool:
        """A generation is tracked and its steps are not steady yet."""
        return self.layout is not None and not self.meter.steady()

    def current(self) -> Measured | None:
        """The running plan as measured, once its steps are steady (None before)."""
        if self.layout is None or not self.meter.steady():
            return None
        if self.told_steady:
            step_s = self.meter.step_s()
            assert step_s is not None
            return self.calibration.learn(self.layout, measured_s=step_s, steps=self.meter.steps)
        self.told_steady = True
        return self._learn(final=False)

    def _learn(self, *, final: bool) -> Measured:
        assert self.layout is not None
        step_s = self.meter.step_s()
        assert step_s is not None
        m = self.calibration.learn(self.layout, measured_s=step_s, steps=self.meter.steps)
        self.journal.record(
            "plan_calibrated",
            gen=self.gen,
            summary=self.summary,
            predicted_step_s=m.predicted_s,
            measured_step_s=round(m.measured_s, 6),
            factor=round(m.factor, 4),
            steps=m.steps,
            final=final,
        )
        return m
