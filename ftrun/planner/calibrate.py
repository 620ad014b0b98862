"""A planner that learns: the cost model calibrated with the step times the job measures.

The cost model (cost.py) predicts from a profile taken in one process and from link figures;
what a real step also pays — above all the pipeline's messages: every send and receive of every
micro-batch, a receive waiting for its peer — it leaves out. So each generation's plan is
measured (`StepMeter`: the job's own step rate once it is steady) and kept (`Calibration`).

How a plan is predicted (`Calibration.apply`), per term rather than per plan:
  1. a plan measured in this job is predicted at its own measurement (its *factor*,
     measured / model, scales every term) — the best evidence there is;
  2. any other plan: the model's terms, plus a cost per message (cost.messages: the sends and
     receives of the busiest pipeline rank) fitted to the plans measured: the least-squares
     cost of a message that makes the model's step plus the plan's messages match the measured
     steps. The profile's compute is taken as it is: it was measured on a device like the
     job's (`ftrun profile` on one of its hosts, at its sustained speed). So a plan of a
     schedule not yet measured is predicted from its own count of messages: Interleaved1F1B
     sends v times as many per micro-batch, which a factor per plan could not carry to 1F1B
     (bench_reconfig: ×5.4–6.6 against ×3.7–4.3, docs/planner.md);
  3. where the measured steps are not above the model's (no cost per message to fit), or no
     plan measured had messages (DP only), one factor, the measured steps' sum over the
     model's, scales every term;
  4. nothing measured yet: the model as it is.

Pure: figures in, figures out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ftrun.planner.cost import messages
from ftrun.planner.layout import Layout
from ftrun.planner.profile import Links

WARMUP_STEPS = 2  # a generation's first steps pay for warm-up (allocations, the first restore)
MIN_STEPS = 5  # steps a measurement needs past the warm-up ...
MIN_WINDOW_S = 3.0  # ... over at least this long (the journal samples progress once a second)
LONG_WINDOW_S = 30.0  # or one step over this long: slow steps still get measured


def plan_key(layout: Layout) -> str:
    """What makes two layouts the same plan: the same ranks doing the same work."""
    stages = "|".join(f"{s}-{e - 1}" for s, e in layout.stages)
    return f"{layout.name} {layout.schedule} m{layout.micro_batch}×M{layout.micro_batches} {stages}"


def layout_messages(layout: Layout) -> int:
    """cost.messages for `layout`: its busiest pipeline rank's sends and receives a step."""
    if layout.pp <= 1:
        return 0
    return messages(pp=layout.pp, v=layout.stages_per_rank, M=layout.micro_batches)


@dataclass(frozen=True, kw_only=True)
class Measured:
    """One plan as the job ran it: the model's step time against the measured one."""

    plan: str  # plan_key
    schedule: str
    slots: int  # ranks it ran on
    predicted_s: float  # the cost model's, uncalibrated
    measured_s: float
    steps: int  # steps the measurement spans
    messages: int = 0  # layout_messages

    @property
    def factor(self) -> float:
        return self.measured_s / self.predicted_s if self.predicted_s > 0 else 1.0


@dataclass(frozen=True)
class Factor:
    value: float  # calibrated step / the model's
    source: str  # "measured", "per message …", "from …" or "uncalibrated"


@dataclass(frozen=True)
class Terms:
    """What the plans measured say about any plan: every model term × `scale`, plus
    `message_s` a message (rule 2 or 3 of the module docstring)."""

    scale: float
    message_s: float
    basis: str  # the plans it was fitted to


def fit_terms(measured: list[Measured]) -> Terms | None:
    """The least-squares cost of a message over `measured` (the model's compute as it is), or,
    where that is not positive, one factor over all (None: nothing measured)."""
    if not measured:
        return None
    basis = " and ".join(m.plan for m in measured)
    residual = [(m.messages, m.measured_s - m.predicted_s) for m in measured]
    squares = sum(n * n for n, _ in residual)
    message_s = sum(n * r for n, r in residual) / squares if squares else 0.0
    if message_s > 0:
        return Terms(1.0, message_s, basis)
    model = sum(m.predicted_s for m in measured)
    return Terms(sum(m.measured_s for m in measured) / model if model > 0 else 1.0, 0.0, basis)


class Calibration:
    """The plans measured, and the rule for predicting any plan with them."""

    def __init__(self) -> None:
        self._by_plan: dict[str, Measured] = {}  # in the order measured, the latest last

    def learn(self, layout: Layout, *, measured_s: float, steps: int) -> Measured:
        """`layout` ran at `measured_s` a step (over `steps` steps): its factor from now on."""
        m = Measured(
            plan=plan_key(layout),
            schedule=layout.schedule,
            slots=layout.slots_used,
            predicted_s=layout.step_s,
            measured_s=measured_s,
            steps=steps,
            messages=layout_messages(layout),
        )
        self._by_plan.pop(m.plan, None)
        self._by_plan[m.plan] = m
        return m

    @property
    def measured(self) -> list[Measured]:
        return list(self._by_plan.values())

    def terms(self) -> Terms | None:
        return fit_terms(self.measured)

    def factor(self, layout: Layout) -> Factor:
        """The calibrated step over the model's, and what it stands on."""
        own = self._by_plan.get(plan_key(layout))
        if own is not None:
            return Factor(own.factor, "measured")
        terms = self.terms()
        if terms is None:
            return Factor(1.0, "uncalibrated")
        calibrated = self.apply(layout).step_s
        value = calibrated / layout.step_s if layout.step_s > 0 else 1.0
        if terms.message_s > 0:
            n = layout_messages(layout)
            how = f"{n} messages × {terms.message_s * 1e3:.2f} ms"
            return Factor(value, f"per message ({how}) from {terms.basis}")
        return Factor(value, f"from {terms.basis}")

    def apply(self, layout: Layout) -> Layout:
        """`layout` as calibrated: its own factor on every term where it was measured, else the
        fitted terms (the cost of its messages counted with its sends, in p2p_s)."""
        own = self._by_plan.get(plan_key(layout))
        if own is not None:
            return scaled(layout, own.factor)
        terms = self.terms()
        if terms is None:
            return layout
        out = scaled(layout, terms.scale)
        if terms.message_s <= 0:
            return out
        extra = terms.message_s * layout_messages(layout)
        return dataclasses.replace(out, p2p_s=out.p2p_s + extra)

    def rank(self, layouts: list[Layout]) -> list[tuple[Layout, Layout]]:
        """(calibrated, model) pairs, fastest calibrated first (a stable sort: the model's ties
        keep the model's order)."""
        pairs = [(self.apply(layout), layout) for layout in layouts]
        return sorted(pairs, key=lambda pair: pair[0].step_s)


def scaled(layout: Layout, factor: float) -> Layout:
    if factor == 1.0:
        return layout
    return dataclasses.replace(
        layout,
        compute_s=layout.compute_s * factor,
        bubble_s=layout.bubble_s * factor,
        allreduce_s=layout.allreduce_s * factor,
        p2p_s=layout.p2p_s * factor,
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
