"""What `inspect --html/--png` and `status --watch` draw from the journal's steady beat, kept in
bounded memory however long the journal: the step points of each generation and the checkpoint
commits (thinned as they come: every k-th is kept, k doubling when the list outgrows twice what
is drawn), the last seconds of the current generation's steps (the step rate), host and plan
markers (the last MAX_MARKERS), what each generation restored, and the first and last times.

A point kept is a point of the journal, so a rate between two kept points is still the exact
mean over the interval. Pure: events in; its state is plain data (`to_json`), so a summary can
carry it (jobview/summary.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

MAX_POINTS_PER_GENERATION = 800
MAX_COMMITS = 1500
MAX_MARKERS = 2000
MAX_TEXT = 400  # journal text (reasons, exceptions) is cut here: a tooltip, not a log
RATE_WINDOW_S = 10.0  # the step rate shown: over the journal's last seconds of progress
RATE_POINTS = 256  # at most this many of those seconds' points are kept


@dataclass
class Thinned:
    """Every k-th of a stream of items, and the last one; at most 2 × `limit` kept."""

    limit: int
    items: list[Any] = field(default_factory=list)
    last: Any = None
    stride: int = 1
    seen: int = 0

    def add(self, item: Any) -> None:
        if self.seen % self.stride == 0:
            self.items.append(item)
            if len(self.items) > 2 * self.limit:
                self.items = self.items[::2]
                self.stride *= 2
        self.seen += 1
        self.last = item

    def kept(self) -> list[Any]:
        """At most `limit` items, evenly spread over those kept, the first and last included."""
        items = list(self.items)
        if self.last is not None and (not items or items[-1] != self.last):
            items.append(self.last)
        return spread(items, self.limit)


def spread(items: list[Any], limit: int) -> list[Any]:
    """`limit` of `items` (all when there are no more), evenly spread, the first and last in."""
    n = len(items)
    if n <= limit or limit < 2:
        return items[:limit] if limit < 2 else items
    return [items[round(i * (n - 1) / (limit - 1))] for i in range(limit)]


@dataclass
class Series:
    steps: dict[int, Thinned] = field(default_factory=dict)  # gen → (t, step), in order
    commits: Thinned = field(default_factory=lambda: Thinned(MAX_COMMITS))  # (t, gen, step)
    recent: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=RATE_POINTS))
    recent_gen: int | None = None
    markers: deque[tuple[float, str, str | None, str | None]] = field(
        default_factory=lambda: deque(maxlen=MAX_MARKERS)
    )  # (t, kind, host, detail)
    restored: dict[int, dict[str, Any]] = field(default_factory=dict)  # step, tier, restore_s
    restores: dict[int, tuple[float, float]] = field(default_factory=dict)  # gen → (t, s)
    first_t: float | None = None
    last_t: float | None = None
    launched: bool = False
    plan: str | None = None

    def feed(self, ev: dict[str, Any]) -> None:
        t = _time(ev)
        if t is None:
            return
        if self.first_t is None or t < self.first_t:
            self.first_t = t
        if self.last_t is None or t > self.last_t:
            self.last_t = t
        kind = ev["kind"]
        if kind not in SERIES_KINDS:
            return
        host, gen, step = ev.get("host"), ev.get("gen"), ev.get("step")
        if kind in ("first_step", "progress") and isinstance(step, int) and isinstance(gen, int):
            line = self.steps.setdefault(gen, Thinned(MAX_POINTS_PER_GENERATION + 1))
            # A pair out of order or going backwards (a clock step) is left out.
            if line.last is None or (t > line.last[0] and step >= line.last[1]):
                line.add((t, step))
            if gen == self.recent_gen:
                self.recent.append((t, step))
                while len(self.recent) > 2 and self.recent[0][0] < t - RATE_WINDOW_S:
                    self.recent.popleft()
        elif kind == "checkpoint_committed":
            self.commits.add((t, gen, step))
        elif kind == "checkpoint_restored" and isinstance(gen, int):
            self.restored[gen] = {k: ev.get(k) for k in ("step", "tier", "restore_s")}
            if isinstance(ev.get("restore_s"), int | float):
                self.restores[gen] = (t, float(ev["restore_s"]))
        elif kind == "generation_launched":
            self.launched = True
            if gen != self.recent_gen:
                self.recent_gen, self.recent = gen, deque(maxlen=RATE_POINTS)
        elif kind == "host_added":
            self.markers.append((t, "host_added", host, None))
        elif kind == "agent_connected" and self.launched:  # the first ones: the job starting
            self.markers.append((t, "host_joined", host, None))
        elif kind == "host_removed":
            self.markers.append((t, "host_removed", host, cut(ev.get("reason"))))
        elif kind == "host_unreachable":
            detail = cut(ev.get("error") or ev.get("reason"))
            self.markers.append((t, "host_unreachable", host, detail))
        elif kind == "fault_detected" and ev.get("fault") == "host-lost":
            self.markers.append((t, "host_lost", host, f"incident {ev.get('incident')}"))
        elif kind == "plan_chosen":
            summary = ev.get("summary")
            if self.plan is not None and summary != self.plan:
                detail = f"{self.plan} → {summary}" + (f" ({ev['why']})" if ev.get("why") else "")
                self.markers.append((t, "plan_changed", None, cut(detail)))
            self.plan = summary

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": [[g, vars(line)] for g, line in self.steps.items()],
            "commits": vars(self.commits),
            "recent": list(self.recent),
            "recent_gen": self.recent_gen,
            "markers": list(self.markers),
            "restored": [[g, r] for g, r in self.restored.items()],
            "restores": [[g, r] for g, r in self.restores.items()],
            "first_t": self.first_t,
            "last_t": self.last_t,
            "launched": self.launched,
            "plan": self.plan,
        }

    @classmethod
    def from_json(cls, state: dict[str, Any]) -> Series:
        def thinned(d: dict[str, Any]) -> Thinned:
            out = Thinned(**d)
            out.items = [tuple(i) for i in out.items]
            out.last = None if out.last is None else tuple(out.last)
            return out

        s = cls()
        s.steps = {int(g): thinned(d) for g, d in state["steps"]}
        s.commits = thinned(state["commits"])
        s.recent = deque((tuple(p) for p in state["recent"]), maxlen=RATE_POINTS)
        s.recent_gen = state["recent_gen"]
        s.markers = deque((tuple(m) for m in state["markers"]), maxlen=MAX_MARKERS)
        s.restored = {int(g): dict(r) for g, r in state["restored"]}
        s.restores = {int(g): (float(r[0]), float(r[1])) for g, r in state["restores"]}
        s.first_t, s.last_t = state["first_t"], state["last_t"]
        s.launched, s.plan = bool(state["launched"]), state["plan"]
        return s


SERIES_KINDS = frozenset(
    "first_step progress checkpoint_committed checkpoint_restored generation_launched host_added "
    "agent_connected host_removed host_unreachable fault_detected plan_chosen".split()
)


def cut(text: object) -> str | None:
    if text is None:
        return None
    s = str(text)
    return s if len(s) <= MAX_TEXT else s[: MAX_TEXT - 1] + "…"


def _time(ev: dict[str, Any]) -> float | None:
    t = ev.get("t")
    if type(t) is float:
        return t
    return float(t) if isinstance(t, int | float) and not isinstance(t, bool) else None
