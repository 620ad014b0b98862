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
_TRAINING = "training"
_RAN = "ran"  # a launched generation of a job without a progress signal: start-up or training
NO_SIGNAL = "no progress signal: the script reports no steps; see ftrun.step / --progress-regex"
NO_STEP_YET = "no progress signal yet: no step reported so far; see ftrun.step / --progress-regex"
_OFF = "off"  # no controller runs: between the runs of a requeued job, after the end


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


@dataclass
class _Gen:
    """What the journal says about one generation, as far as goodput needs it."""

    number: int
    world_size: int = 0
    first_step: int | None = None
    last_step: int | None = None
    stall_s: float = 0.0
    restore_s: float = 0.0
    restored_step: int | None = None
    predicted_step_s: float | None = None
    full_step_s: float | None = None
    launched: bool = False
    spans: dict[str, float] = field(default_factory=dict)  # label → seconds


def job_goodput(view: JobView, *, now: float | None = None) -> GoodputReport:
    """The goodput account of a job as `status` and `inspect` read it."""
    return account(view.events, running=view.state == "running", now=now)


def account(
    events: Iterable[dict[str, Any]], *, running: bool, now: float | None = None
) -> GoodputReport:
    """The goodput account of a job from its events. `running`: the controller still runs, so
    the account goes on to `now`; otherwise it stops at the job's last event."""
    events = list(events)
    signal = any(_is_step(ev) for ev in events)
    marks, gens, full_world = _marks(events, signal=signal)
    if not marks:
        return GoodputReport(Share(), {}, now or time.time())
    last_t = max(float(ev.get("t", 0.0)) for ev in events)
    end_t = max(last_t, now if now is not None else time.time()) if running else last_t
    for (t, label, gen), (t_next, _, _) in zip(marks, [*marks[1:], (end_t, _OFF, 0)], strict=True):
        if label == _OFF or gen not in gens:
            continue
        span = max(0.0, min(t_next, end_t) - t)
        gens[gen].spans[label] = gens[gen].spans.get(label, 0.0) + span
    _restored_steps(events, gens)
    report = GoodputReport(Share(), {}, end_t)
    numbers = sorted(gens)
    why = NO_STEP_YET if running else NO_SIGNAL
    for i, number in enumerate(numbers):
        nxt = gens[numbers[i + 1]] if i + 1 < len(numbers) else None
        share = _account(gens[number], nxt, full_world)
        if not signal and gens[number].launched:
            share.unknown = why
        report.generations[number] = share
        report.job.add(share)
    return report


def _marks(
    events: list[dict[str, Any]], *, signal: bool
) -> tuple[list[tuple[float, str, int]], dict[int, _Gen], int]:
    """Where each stretch of time begins: (t, label, generation that owns it), by time; the
    generations; and the job's full world size (its original hosts × ranks per host).
    `signal`: the journal has steps; without, a launch begins what no step tells apart."""
    marks: list[tuple[float, str, int]] = []
    gens: dict[int, _Gen] = {}
    current = 0  # the generation that owns the time now (0: before the first launch)
    first_of_run = True
    full_world = 0
    full_step: float | None = None
    plans: dict[int, dict[str, Any]] = {}
    for ev in events:
        kind, t = ev["kind"], float(ev.get("t", 0.0))
        gen = ev.get("gen")
        if kind == "job_started":
            first_of_run = True
            nproc = ev.get("nproc_per_node") or 1
            hosts = ev.get("max_nodes") or len(ev.get("hosts") or [])  # --max-nodes: spot jobs
            full_world = full_world or hosts * nproc
            marks.append((t, "startup", current + 1))  # owned by the generation it starts
        elif kind == "plan_chosen" and isinstance(gen, int):
            plans[gen] = ev
            if isinstance(ev.get("full_step_s"), (int, float)):
                full_step = full_step or float(ev["full_step_s"])
        elif kind == "generation_launched" and isinstance(gen, int):
            current = gen
            g = gens.setdefault(gen, _Gen(gen))
            g.world_size = ev.get("world_size") or 0
            plan = plans.get(gen)
            if plan is not None:
                g.predicted_step_s = plan.get("predicted_step_s")
            g.full_step_s = full_step
            g.launched = True
            label = ("startup" if first_of_run else "relaunch") if signal else _RAN
            marks.append((t, label, gen))
            first_of_run = False
        elif kind in ("first_step", "progress") and isinstance(gen, int) and gen in gens:
            g, step = gens[gen], ev.get("step")
            if kind == "first_step":
                g.first_step = step
                marks.append((t, _TRAINING, gen))
            if isinstance(step, int):
                g.last_step = step if g.last_step is None else max(g.last_step, step)
            if isinstance(ev.get("stall_s"), (int, float)):
                g.stall_s = max(g.stall_s, float(ev["stall_s"]))
        elif kind == "checkpoint_restored" and isinstance(gen, int) and gen in gens:
            gens[gen].restore_s = float(ev.get("restore_s") or 0.0)
            gens[gen].restored_step = ev.get("step")
        elif kind == "fault_detected":
            owner = gen if isinstance(gen, int) else current
            fault_t = ev.get("fault_t")
            detected_t = float(ev.get("detected_t") or t)
            if isinstance(fault_t, (int, float)) and fault_t < detected_t:
                marks.append((float(fault_t), "detection", owner))
            marks.append((detected_t, "teardown", owner))
            if isinstance(ev.get("step"), int) and owner in gens:
                g = gens[owner]
                g.last_step = ev["step"] if g.last_step is None else max(g.last_step, ev["step"])
        elif kind == "stop_requested" and current in gens:  # Ctrl-C, SIGTERM: the end begins
            marks.append((t, "teardown", current))
        elif kind in ("persist_requested", "reconfigure"):  # a grow's persist: its cost too
            marks.append((t, "teardown", gen if isinstance(gen, int) else current))
        elif kind == "torn_down":
            marks.append((t, "waiting_for_hosts", current))
        elif kind == "generation_ended" and isinstance(gen, int):
            if isinstance(ev.get("step"), int) and gen in gens:
                g = gens[gen]
                g.last_step = ev["step"] if g.last_step is None else max(g.last_step, ev["step"])
            # After a fault or a reconfiguration: the gap before the next generation; after any
            # other end (succeeded, stopped, preempted): the job shutting down.
            gap = ev.get("outcome") in ("failed", "reconfigured")
            label = "waiting_for_hosts" if gap else "teardown"
            marks.append((t, label, gen))
        elif kind == "job_finished":
            marks.append((t, _OFF, current))
    marks.sort(key=lambda m: m[0])  # stable: marks at one time keep the journal's order
    for _, _, owner in marks:  # a job that never launched still has its start-up to account
        if owner not in gens:
            gens[owner] = _Gen(owner)
    return marks, gens, full_world


def _is_step(ev: dict[str, Any]) -> bool:
    step = ev.get("step")
    return ev["kind"] in ("first_step", "progress") and isinstance(step, int)


def _restored_steps(events: list[dict[str, Any]], gens: dict[int, _Gen]) -> None:
    """Scripts without ftrun.checkpoint report no restore: the step they start again at is the
    one before their first step."""
    for g in gens.values():
        if g.restored_step is None and g.first_step is not None and g.number > 1:
            g.restored_step = max(0, g.first_step - 1)


def _account(g: _Gen, nxt: _Gen | None, full_world: int) -> Share:
    share = Share()
    share.wall_s = sum(g.spans.values())
    for label, seconds in g.spans.items():
        if label == _RAN:
            share.unknown_s += seconds
        elif label != _TRAINING:
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
    training = g.spans.get(_TRAINING, 0.0)
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


def _speed(g: _Gen, full_world: int) -> float:
    """The generation's throughput relative to the best plan on the job's original hosts: the
    planner's predictions in a planned job, else in proportion to the ranks (DP only)."""
    if g.predicted_step_s and g.full_step_s:
        return min(1.0, g.full_step_s / g.predicted_step_s)
    if full_world and g.world_size:
        return min(1.0, g.world_size / full_world)
    return 1.0
