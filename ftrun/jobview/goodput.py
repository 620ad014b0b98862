"""Goodput: how much of a job's wall time became training that was kept, and where the rest went.

Goodput is MegaScale's ETTR (effective training time ratio): the time spent in steps that were
kept, over the job's wall time. The rest is badput, split into buckets after Google's ML
goodput: every second of the wall time lands in exactly one bucket, so goodput and the buckets
add up to the wall time, per generation and for the job.

The account is read from the journal alone (so it holds for running, finished and crashed jobs,
and for the journals `ftrun simulate` writes): the events mark where each stretch of time begins,

    job_started ─ startup ─▶ first_step ─ training ─▶ fault ─ detection ─▶ detected ─ teardown ─▶
    torn_down ─ waiting_for_hosts ─▶ generation_launched ─ relaunch ─▶ first_step ─ training …

and a generation's training time is then split by what the journal says about it:
  restore           the restore its ranks reported (`checkpoint_restored`), out of its relaunch
  recomputed        the steps it ran that the next generation did again (it restored an older one)
  checkpoint_stall  what rank 0 spent blocked on checkpoints (`stall_s` in `progress`)
  smaller_plan      the share a smaller plan runs slower than the best plan on the job's original
                    hosts: the planner's predictions in a planned job (`full_step_s`); in a DP-only
                    job, throughput in proportion to the ranks
A generation owns the time from its launch to the next one's (the first also the job's
start-up), so the generations' accounts add up to the job's. Between runs of a requeued job no
controller runs and nothing is paid: that time is not the job's wall time.

Without a progress signal (no `ftrun.step()`, no `--progress-regex` match: no step anywhere in
the journal) the first step never comes, so nothing tells start-up from training: the time from
each launch on is `unknown_s` (ran, doing what no step said), goodput is unknown (None, not 0)
and `unknown` says why. What the journal does time (before the launch, detection, teardown,
waiting for hosts, a reported restore) stays badput; the account still adds up.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ftrun.jobview.goodput_fold import OFF, RAN, TRAINING, GenFigures, GoodputFold
from ftrun.jobview.views import JobView

BUCKETS = (
    "startup",
    "detection",
    "teardown",
    "waiting_for_hosts",
    "relaunch",
    "restore",
    "recomputed",
    "checkpoint_stall",
    "smaller_plan",
    "other",
)
BUCKET_LABELS = {
    "startup": "start-up",
    "detection": "detection",
    "teardown": "teardown",
    "waiting_for_hosts": "waiting for hosts",
    "relaunch": "relaunch",
    "restore": "restore",
    "recomputed": "recomputed steps",
    "checkpoint_stall": "checkpoint stalls",
    "smaller_plan": "smaller plan",
    "other": "other",
}
NO_SIGNAL = "no progress signal: the script reports no steps; see ftrun.step / --progress-regex"
NO_STEP_YET = "no progress signal yet: no step reported so far; see ftrun.step / --progress-regex"


@dataclass
class Share:
    """One account: the wall time, the productive part of it, and the badput by bucket. With
    `unknown` (why), `unknown_s` of it ran without a step to tell start-up from training: the
    productive part and the ratio are unknown (None), the rest adds up as ever."""

    wall_s: float = 0.0
    productive_s: float = 0.0
    buckets: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))
    unknown_s: float = 0.0
    unknown: str | None = None

    @property
    def ratio(self) -> float | None:
        if self.unknown is not None:
            return None
        return self.productive_s / self.wall_s if self.wall_s > 0 else None

    @property
    def badput_s(self) -> float:
        return sum(self.buckets.values())

    def add(self, other: Share) -> None:
        self.wall_s += other.wall_s
        self.productive_s += other.productive_s
        self.unknown_s += other.unknown_s
        self.unknown = self.unknown or other.unknown
        for name, seconds in other.buckets.items():
            self.buckets[name] += seconds

    def to_json(self) -> dict[str, Any]:
        return {
            "wall_s": round(self.wall_s, 3),
            "productive_s": None if self.unknown else round(self.productive_s, 3),
            "goodput": None if self.ratio is None else round(self.ratio, 4),
            "goodput_unknown": self.unknown,
            "unknown_s": round(self.unknown_s, 3),
            "badput_s": {name: round(s, 3) for name, s in self.buckets.items()},
        }


@dataclass
class GoodputReport:
    job: Share
    generations: dict[int, Share]
    end_t: float  # where the account stops: the job's end, or now while it runs

    def to_json(self) -> dict[str, Any]:
        return {
            **self.job.to_json(),
            "end_t": self.end_t,
            "generations": {str(g): s.to_json() for g, s in self.generations.items()},
        }


def job_goodput(view: JobView, *, now: float | None = None) -> GoodputReport:
    """The goodput account of a job as `status` and `inspect` read it."""
    return report_of(view.goodput, running=view.state == "running", now=now)


def account(
    events: Iterable[dict[str, Any]], *, running: bool, now: float | None = None
) -> GoodputReport:
    """The goodput account of a job from its events. `running`: the controller still runs, so
    the account goes on to `now`; otherwise it stops at the job's last event."""
    fold = GoodputFold()
    for ev in events:
        fold.feed(ev)
    return report_of(fold, running=running, now=now)


def report_of(fold: GoodputFold, *, running: bool, now: float | None = None) -> GoodputReport:
    """The account of what `fold` has seen (it is not changed: it may go on folding)."""
    marks, gens = fold.resolved()
    if not marks or fold.last_t is None:
        return GoodputReport(Share(), {}, now or time.time())
    last_t = fold.last_t
    end_t = max(last_t, now if now is not None else time.time()) if running else last_t
    for (t, label, gen), (t_next, _, _) in zip(marks, [*marks[1:], (end_t, OFF, 0)], strict=True):
        if label == OFF or gen not in gens:
            continue
        span = max(0.0, min(t_next, end_t) - t)
        gens[gen].spans[label] = gens[gen].spans.get(label, 0.0) + span
    # Scripts without ftrun.checkpoint report no restore: the step they start again at is the
    # one before their first step.
    for g in gens.values():
        if g.restored_step is None and g.first_step is not None and g.number > 1:
            g.restored_step = max(0, g.first_step - 1)
    report = GoodputReport(Share(), {}, end_t)
    numbers = sorted(gens)
    why = NO_STEP_YET if running else NO_SIGNAL
    for i, number in enumerate(numbers):
        nxt = gens[numbers[i + 1]] if i + 1 < len(numbers) else None
        share = _account(gens[number], nxt, fold.full_world)
        if not fold.signal and gens[number].launched:
            share.unknown = why
        report.generations[number] = share
        report.job.add(share)
    return report


def _account(g: GenFigures, nxt: GenFigures | None, full_world: int) -> Share:
    share = Share()
    share.wall_s = sum(g.spans.values())
    for label, seconds in g.spans.items():
        if label == RAN:
            share.unknown_s += seconds
        elif label != TRAINING:
            share.buckets[label if label in share.buckets else "other"] += seconds
    # The restore happened inside the relaunch (or start-up; without steps, what ran): take it
    # out of there.
    if share.unknown_s > 0:
        restore = min(g.restore_s, share.unknown_s)
        share.unknown_s -= restore
    else:
        before = "relaunch" if share.buckets["relaunch"] > 0 else "startup"
        restore = min(g.restore_s, share.buckets[before])
        share.buckets[before] -= restore
    share.buckets["restore"] += restore
    training = g.spans.get(TRAINING, 0.0)
    recomputed = 0.0
    if (
        nxt is not None
        and nxt.restored_step is not None
        and g.first_step is not None
        and g.last_step is not None
    ):
        # Its training ran steps first+1..last (and part of the next); the next generation
        # kept those up to the step it restored and did the rest again.
        steps = g.last_step - g.first_step
        kept_steps = min(g.last_step, nxt.restored_step) - g.first_step
        kept_part = (
            max(0.0, kept_steps / steps) if steps > 0 else float(nxt.restored_step >= g.last_step)
        )
        recomputed = training * (1.0 - min(1.0, kept_part))
    stall = min(g.stall_s, training - recomputed)
    kept = training - recomputed - stall
    smaller = kept * (1.0 - _speed(g, full_world))
    share.buckets["recomputed"] += recomputed
    share.buckets["checkpoint_stall"] += stall
    share.buckets["smaller_plan"] += smaller
    share.productive_s = kept - smaller
    return share


def _speed(g: GenFigures, full_world: int) -> float:
    """The generation's throughput relative to the best plan on the job's original hosts: the
    planner's predictions in a planned job, else in proportion to the ranks (DP only)."""
    if g.predicted_step_s and g.full_step_s:
        return min(1.0, g.full_step_s / g.predicted_step_s)
    if full_world and g.world_size:
        return min(1.0, g.world_size / full_world)
    return 1.0
