"""A planner that learns: the cost model calibrated with the step times the job measures.

The cost model (cost.py) predicts from a profile taken in one process and from link figures; it
leaves out what a real step also pays — the schedule's Python and its waits between ranks, a
snapshot, a send per micro-batch, cores shared with other ranks (the optimizer step and a CPU's
reduce are profiled now) — and on the testbed it was 29–76 % off.
So each generation's plan is measured (`StepMeter`: the job's own step rate once it is steady)
and the ratio measured / predicted, its *factor*, is kept per plan (`Calibration`).

How a factor transfers (the rule `Calibration.factor` applies):
  1. a plan measured in this job is predicted at its own factor — the best evidence there is;
  2. a plan not measured takes its factor from the plans measured with its schedule, if any
     was, else from those with no more virtual stages a rank than it has (Interleaved1F1B's
     2, 1F1B's and GPipe's 1), else none: on hosts of a fixed speed the schedule set the
     factor, not the ranks (bench_reconfig, docs/planner.md: Interleaved1F1B ×5.4–6.6, 1F1B
     ×3.7–4.3 on 3 and 4 ranks alike). Interleaved1F1B pays what a 1F1B pipeline pays and
     then its v-fold handoffs between ranks, which the model does not count (its factors
     ×1.5–2.2 where 1F1B's were ×0.9–1.5 with the profile at the hosts' speed), so a 1F1B
     factor is a floor for it; an Interleaved factor passed down to a 1F1B plan predicted the
     re-plan +30 to +78 % off in 7 of 8 runs where the model alone was −26 to +9 %;
  3. of those, from the plans measured on as many ranks or the nearest numbers of ranks:
     between a smaller and a larger one, interpolated linearly in the number of ranks; beyond
     them, the nearest (of several plans on one number of ranks, the latest measured). Much of
     what the model leaves out is paid per rank (each rank's optimizer step, its Python, its
     share of the host's cores where hosts share them) or grows with the ranks (collectives,
     sends), so plans of about as many ranks err alike;
  4. nothing measured yet, or only plans with more stages a rank: factor 1, the model as it is.

One factor scales every term of a plan's step (compute, bubble, all-reduce, sends, the
device's reduce, the optimizer) alike: the step rate is what the job measures for a plan as a
whole. Pure: figures in, figures out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ftrun.planner.layout import STEP_TERMS, Layout
from ftrun.planner.profile import Links

WARMUP_STEPS = 2  # a generation's first steps pay for warm-up (allocations, the first restore)
MIN_STEPS = 5  # steps a measurement needs past the warm-up ...
MIN_WINDOW_S = 3.0  # ... over at least this long (the journal samples progress once a second)
LONG_WINDOW_S = 30.0  # or one step over this long: slow steps still get measured


def plan_key(layout: Layout) -> str:
    """What makes two layouts the same plan: the same ranks doing the same work."""
    stages = "|".join(f"{s}-{e - 1}" for s, e in layout.stages)
    return f"{layout.name} {layout.schedule} m{layout.micro_batch}×M{layout.micro_batches} {stages}"


@dataclass(frozen=True, kw_only=True)
class Measured:
    """One plan as the job ran it: the model's step time against the measured one."""

    plan: str  # plan_key
    schedule: str
    slots: int  # ranks it ran on
    stages_per_rank: int  # virtual stages a pipeline rank holds (2: Interleaved1F1B)
    predicted_s: float  # the cost model's, uncalibrated
    measured_s: float
    steps: int  # steps the measurement spans

    @property
    def factor(self) -> float:
        return self.measured_s / self.predicted_s if self.predicted_s > 0 else 1.0


@dataclass(frozen=True)
class Factor:
    value: float
    source: str  # "measured", "from <plan>" or "uncalibrated"


class Calibration:
    """Measured factors per plan, and the rule for predicting any plan with them."""

    def __init__(self) -> None:
        self._by_plan: dict[str, Measured] = {}  # in the order measured, the latest last

    def learn(self, layout: Layout, *, measured_s: float, steps: int) -> Measured:
        """`layout` ran at `measured_s` a step (over `steps` steps): its factor from now on."""
        m = Measured(
            plan=plan_key(layout),
            schedule=layout.schedule,
            slots=layout.slots_used,
            stages_per_rank=layout.stages_per_rank,
            predicted_s=layout.step_s,
            measured_s=measured_s,
            steps=steps,
        )
        self._by_plan.pop(m.plan, None)
        self._by_plan[m.plan] = m
        return m

    @property
    def measured(self) -> list[Measured]:
        return list(self._by_plan.values())

    def factor(self, layout: Layout) -> Factor:
        own = self._by_plan.get(plan_key(layout))
        if own is not None:
            return Factor(own.factor, "measured")
        if not self._by_plan:
            return Factor(1.0, "uncalibrated")
        alike = [m for m in self._by_plan.values() if m.schedule == layout.schedule]
        if not alike:  # a factor passes to as many stages a rank or more, never fewer
            alike = [
                m for m in self._by_plan.values() if m.stages_per_rank <= layout.stages_per_rank
            ]
        if not alike:
            return Factor(1.0, "uncalibrated")
        by_slots: dict[int, Measured] = {}
        for m in alike:  # the latest of each number of ranks
            by_slots[m.slots] = m
        n = layout.slots_used
        below = [s for s in by_slots if s <= n]
        above = [s for s in by_slots if s >= n]
        if below and above and max(below) != min(above):
            lo, hi = by_slots[max(below)], by_slots[min(above)]
            w = (n - lo.slots) / (hi.slots - lo.slots)
            value = lo.factor + w * (hi.factor - lo.factor)
            return Factor(value, f"from {lo.plan} and {hi.plan}")
        near = by_slots[max(below) if below else min(above)]
        return Factor(near.factor, f"from {near.plan}")

    def apply(self, layout: Layout) -> Layout:
        """`layout` with every predicted term scaled by its factor."""
        return scaled(layout, self.factor(layout).value)

    def rank(self, layouts: list[Layout]) -> list[tuple[Layout, Layout]]:
        """(calibrated, model) pairs, fastest calibrated first (a stable sort: the model's ties
        keep the model's order)."""
        pairs = [(self.apply(layout), layout) for layout in layouts]
        return sorted(pairs, key=lambda pair: pair[0].step_s)


def scaled(layout: Layout, factor: float) -> Layout:
    if factor == 1.0:
        return layout
    return dataclasses.replace(
        layout, **{term: getattr(layout, term) * factor for term in STEP_TERMS}
    )


@dataclass
class StepMeter:
    """One generation's step rate from (step, time) samples — its first step, then the
    journal's progress events: seconds a step between the first sample past the warm-up and
    the latest."""

    first: int | None = None
    ref: tuple[int, float] | None = None
    last: tuple[int, float] | None = None

    def sample(self, step: int, t: float, *, first: bool = False) -> None:
        if first or self.first is None:
            self.first = step if self.first is None else min(self.first, step)
        if self.ref is None:
            if step >= self.first + WARMUP_STEPS:
                self.ref = (step, t)
            return
        if step > self.ref[0] and t > self.ref[1]:
            self.last = (step, t)

    @property
    def steps(self) -> int:
        return self.last[0] - self.ref[0] if self.ref and self.last else 0

    @property
    def span_s(self) -> float:
        return self.last[1] - self.ref[1] if self.ref and self.last else 0.0

    def steady(self) -> bool:
        """Enough steps past the warm-up to stand for the plan."""
        n, span = self.steps, self.span_s
        return (n >= MIN_STEPS and span >= MIN_WINDOW_S) or (n >= 1 and span >= LONG_WINDOW_S)

    def step_s(self) -> float | None:
        return self.span_s / self.steps if self.steps else None


def measured_links(links: Links, *, latency_s: float | None, bandwidth_Bps: float | None) -> Links:
    """The link check's typical pair (agent/linkprobe.py: latency = the median 2-rank
    all-reduce of one float, a round trip; bandwidth = a 2 MiB 2-rank all-reduce's algorithm
    bandwidth) in place of the default figures of `links`: a 2-rank ring all-reduce takes
    G / bw and two latencies (cost.allreduce_s), so bw is taken as is for the all-reduce and
    for a send of G bytes, and half the round trip as each step's (and each send's) latency.
    A figure the profile states (not the default) is kept, and so is one the check lacks."""
    figures: dict[str, float] = {}
    if bandwidth_Bps is not None and bandwidth_Bps > 0:
        figures.update(allreduce_bytes_per_s=bandwidth_Bps, p2p_bytes_per_s=bandwidth_Bps)
    if latency_s is not None and latency_s > 0:
        figures.update(allreduce_latency_s=latency_s / 2, p2p_latency_s=latency_s / 2)
    default = Links()
    unstated = {k: v for k, v in figures.items() if getattr(links, k) == getattr(default, k)}
    return dataclasses.replace(links, **unstated)
