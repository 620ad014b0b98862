"""A job's timeline as data: what `ftrun inspect --html` and `--png` draw, from the journal alone.

Pure: a JobView (with its folded series: jobview/series.py) in, a JSON-able `Timeline` out; no I/O, and the clock is a
parameter (a running job's timeline ends at `now`). Both renderers draw this one structure, so
the page and the image cannot disagree, and the numbers on them are tested here, without a
browser. Times are seconds from the job's start.

The step rate is measured between consecutive `first_step`/`progress` events of a generation
(the journal takes the step about once a second), never across a restart. An incident's band
is cut into phases by `ftrun.jobview.phases`.
Long jobs are thinned (progress points and commits, evenly spread over those the fold kept) so
a page stays small; a rate between thinned points is still the exact mean over the longer
interval.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import Any

from ftrun.jobview.goodput import BUCKET_LABELS, BUCKETS, GoodputReport, job_goodput
from ftrun.jobview.phases import PHASES, PhaseSegment, segments
from ftrun.jobview.series import MAX_POINTS_PER_GENERATION, cut, spread
from ftrun.jobview.views import Incident, JobView

# Markers: kind → label. Hosts joining, hosts leaving, and a new plan.
MARKERS = {
    "host_added": "host added",
    "host_joined": "host joined",
    "host_removed": "host removed",
    "host_lost": "host lost",
    "host_unreachable": "host unreachable",
    "plan_changed": "plan changed",
}


@dataclass
class RatePoint:
    """The mean step rate from the previous point of its generation to this one."""

    t0: float
    t1: float
    step0: int
    step1: int
    rate: float  # steps per second


@dataclass
class GenSpan:
    number: int
    start: float
    end: float
    open: bool  # still running: `end` is now
    hosts: list[str]
    world_size: int
    outcome: str | None
    plan: str | None
    plan_why: str | None
    predicted_step_s: float | None
    measured_step_s: float | None
    first_step_t: float | None
    first_step: int | None
    last_step: int | None
    restored: dict[str, Any] | None  # checkpoint_restored: step, tier, restore_s
    goodput: float | None  # productive share of this generation's wall time (None: unknown)
    # Where its paler "starting" part ends: its first step, or its end if it never stepped;
    # None in a job without a progress signal, whose generations ran (no step tells how long
    # they were starting), so they are drawn as running from their launch.
    starting_end: float | None
    points: list[RatePoint] = field(default_factory=list)


@dataclass
class IncidentBand:
    id: int
    generation: int
    kind: str
    host: str | None
    rank: int | None
    tier: str | None
    reason: str | None
    exception: str | None
    injected: str | None
    step_at_fault: int | None
    lost_steps: int | None
    start: float
    end: float
    segments: list[PhaseSegment]


@dataclass
class Marker:
    t: float
    kind: str  # a key of MARKERS
    host: str | None
    detail: str | None


@dataclass
class Commit:
    t: float
    gen: int | None
    step: int | None


@dataclass
class Timeline:
    job_id: str
    name: str
    state: str
    reason: str | None
    started_wall: float | None  # the job's start, seconds since the epoch (shown as a date)
    span: float  # seconds from the start to the end (or to now, for a running job)
    live: bool
    generations: list[GenSpan]
    incidents: list[IncidentBand]
    markers: list[Marker]
    commits: list[Commit]
    commits_total: int  # before thinning
    max_rate: float
    hosts: dict[str, str]
    # Job-wide: ratio, productive_s, wall_s, lost [[label, s]]; without a progress signal
    # ratio and productive_s are None, `unknown` says why and `unknown_s` is the time it covers.
    goodput: dict[str, Any] | None
    phases: list[str] = field(default_factory=lambda: list(PHASES))
    markers_legend: dict[str, str] = field(default_factory=lambda: dict(MARKERS))

    def to_json(self) -> dict[str, Any]:
        """Plain JSON: no NaN or infinity (a journal's odd number must not break JSON.parse)."""
        return _finite(asdict(self))


def build_timeline(view: JobView, *, now: float, report: GoodputReport | None = None) -> Timeline:
    """`report`: the job's goodput where the caller has it already (else it is computed)."""
    series = view.series
    origin = _origin(view)
    end_wall = _end(view, now)
    live = view.state == "running"
    report = report or job_goodput(view, now=now)
    goodput = _goodput(report)
    signal = report.job.unknown is None  # steps tell start-up from training

    def rel(t: float) -> float:
        return round(t - origin, 3)

    restored = series.restored
    restores = series.restores  # generation → (when its restore was reported done, its seconds)
    steps = {gen: line.kept() for gen, line in series.steps.items()}
    gens = []
    for g in view.generations:
        ended = g.ended_t if g.ended_t is not None else end_wall
        end = rel(max(ended, g.launched_t))
        gens.append(
            GenSpan(
                number=g.number,
                start=rel(g.launched_t),
                end=end,
                open=g.ended_t is None and live,
                hosts=list(g.hosts),
                world_size=g.world_size,
                outcome=g.outcome,
                plan=cut(g.plan),
                plan_why=cut(g.plan_why),
                predicted_step_s=g.predicted_step_s,
                measured_step_s=g.measured_step_s,
                first_step_t=None if g.first_step_t is None else rel(g.first_step_t),
                first_step=g.first_step,
                last_step=g.last_step,
                restored=restored.get(g.number),
                goodput=goodput["generations"].get(g.number),
                starting_end=(
                    None if not signal else end if g.first_step_t is None else rel(g.first_step_t)
                ),
                points=rate_points(steps.get(g.number, []), origin),
            )
        )
    commits = [Commit(rel(t), gen, step) for t, gen, step in series.commits.kept()]
    rates = [p.rate for g in gens for p in g.points]
    return Timeline(
        job_id=view.job_id,
        name=view.name,
        state=view.state,
        reason=cut(view.reason),
        started_wall=view.started_t,
        span=max(rel(end_wall), 0.001),
        live=live,
        generations=gens,
        incidents=[
            _band(inc, origin, end_wall if live else None, restores.get(inc.next_generation or -1))
            for inc in view.incidents
        ],
        markers=[Marker(rel(t), kind, host, detail) for t, kind, host, detail in series.markers],
        commits=commits,
        commits_total=series.commits.seen,
        max_rate=max(rates, default=0.0),
        hosts=dict(view.hosts),
        goodput=goodput["job"],
    )


def rate_points(steps: list[tuple[float, int]], origin: float) -> list[RatePoint]:
    """The step rate of one generation between its consecutive journaled (time, step) pairs;
    a pair out of order or going backwards (a clock step) is left out."""
    seen: list[tuple[float, int]] = []
    for t, step in steps:
        if not seen or (t > seen[-1][0] and step >= seen[-1][1]):
            seen.append((t, step))
    seen = spread(seen, MAX_POINTS_PER_GENERATION + 1)
    return [
        RatePoint(
            t0=round(a_t - origin, 3),
            t1=round(b_t - origin, 3),
            step0=a_step,
            step1=b_step,
            rate=round((b_step - a_step) / (b_t - a_t), 4),
        )
        for (a_t, a_step), (b_t, b_step) in pairwise(seen)
    ]


def _band(
    inc: Incident, origin: float, end: float | None, restore: tuple[float, float] | None
) -> IncidentBand:
    pieces = [
        PhaseSegment(s.phase, round(s.start - origin, 3), round(s.end - origin, 3), s.open)
        for s in segments(inc, end=end, restore=restore)
    ]
    start = inc.fault_t if inc.fault_t is not None else inc.detected_t
    return IncidentBand(
        id=inc.id,
        generation=inc.generation,
        kind=inc.kind,
        host=inc.host,
        rank=inc.rank,
        tier=inc.tier,
        reason=cut(inc.reason),
        exception=cut(inc.exception),
        injected=cut(inc.injected),
        step_at_fault=inc.step_at_fault,
        lost_steps=inc.lost_steps,
        start=round(start - origin, 3),
        end=pieces[-1].end if pieces else round(start - origin, 3),
        segments=pieces,
    )


def _origin(view: JobView) -> float:
    if view.started_t is not None:
        return view.started_t
    return view.series.first_t if view.series.first_t is not None else 0.0


def _end(view: JobView, now: float) -> float:
    """A finished job ends when it finished; a running one now; one whose controller died at
    its last event."""
    last = view.series.last_t if view.series.last_t is not None else _origin(view)
    if view.ended_t is not None:
        return max(view.ended_t, last)
    return max(now, last) if view.state == "running" else last


def _goodput(report: GoodputReport) -> dict[str, Any]:
    """The job's goodput line and each generation's ratio, in the words of the goodput table."""
    share = report.job
    lost = [
        [BUCKET_LABELS.get(k, k), round(share.buckets.get(k, 0.0), 3)]
        for k in BUCKETS
        if share.buckets.get(k, 0.0) > 0
    ]
    return {
        "job": None
        if share.wall_s <= 0
        else {
            "ratio": share.ratio,
            "productive_s": None if share.unknown else round(share.productive_s, 3),
            "wall_s": round(share.wall_s, 3),
            "lost": lost,
            "unknown": share.unknown,
            "unknown_s": round(share.unknown_s, 3),
        },
        "generations": {n: s.ratio for n, s in report.generations.items()},
    }


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj
