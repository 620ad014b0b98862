"""Availability traces: when hosts come and go, in the public `t_ms,add|remove,node` format.

One event a line: milliseconds from the start, whether the node joins or leaves, and its name
(the format of the spot-instance traces that Bamboo, Parcae and Oobleck replay; see
../shared/traces/README.md). `ftrun replay` follows one on real hosts; `ftrun simulate` follows
one through the controller's own decisions in simulated time. Both read it here, checked once:
every problem found is reported together, with its line number.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ftrun.errors import UsageError

MAX_TRACE_BYTES = 64 << 20  # a 10-hour trace is a few KiB; more is not a trace
MAX_PROBLEMS_SHOWN = 10
# What a trace may span and hold, once scaled and with the job's tail: the public traces span
# hours and hold hundreds of events. A time in the far future made `ftrun simulate` journal a
# simulated job's progress without end (issue 34); 100,000 events simulate in about 40 s.
MAX_SPAN_S = 31 * 86400.0
MAX_EVENTS = 100_000
ACTIONS = ("add", "remove")


@dataclass(frozen=True)
class TraceEvent:
    t_s: float  # seconds from the start of the trace
    action: str  # "add" or "remove"
    node: str


@dataclass(frozen=True)
class Trace:
    path: str
    events: tuple[TraceEvent, ...]  # by time, in file order at equal times

    @property
    def duration_s(self) -> float:
        return self.events[-1].t_s if self.events else 0.0

    def nodes(self) -> list[str]:
        """Every node the trace names, in order of first appearance."""
        return list(dict.fromkeys(e.node for e in self.events))

    def up_at(self, t_s: float) -> list[str]:
        """The nodes up at `t_s` (events at exactly `t_s` included), in order of arrival."""
        up: dict[str, None] = {}
        for e in self.events:
            if e.t_s > t_s:
                break
            if e.action == "add":
                up[e.node] = None
            else:
                up.pop(e.node, None)
        return list(up)

    def most_up(self) -> int:
        """The most nodes up at once."""
        up: set[str] = set()
        most = 0
        for e in self.events:
            (up.add if e.action == "add" else up.discard)(e.node)
            most = max(most, len(up))
        return most

    def scaled(self, factor: float) -> Trace:
        """The same trace with its times multiplied by `factor` (0.1: ten times faster)."""
        events = tuple(TraceEvent(e.t_s * factor, e.action, e.node) for e in self.events)
        return Trace(self.path, events)

    def span_problem(self, tail_s: float = 0.0) -> str | None:
        """Why this (scaled) trace is too long to follow, tail included; None when it is not."""
        if len(self.events) > MAX_EVENTS:
            return f"{self.path} has {len(self.events):,} events: at most {MAX_EVENTS:,}"
        if self.duration_s + tail_s > MAX_SPAN_S:
            return (
                f"{self.path} spans {(self.duration_s + tail_s) / 86400:,.1f} days with its tail: "
                f"at most {MAX_SPAN_S / 86400:.0f} (a time in the far future?)"
            )
        return None

    def mean_time_between_changes_s(self) -> float:
        changes = max(1, sum(1 for e in self.events if e.t_s > 0))
        return max(1.0, self.duration_s / changes)

    def first_time_with(self, n: int) -> float | None:
        """When at least `n` nodes are first up at once (None: never)."""
        up: set[str] = set()
        for e in self.events:
            (up.add if e.action == "add" else up.discard)(e.node)
            if len(up) >= n:
                return e.t_s
        return None


def parse_trace(text: str, *, path: str = "<trace>") -> Trace:
    """The trace in `text`; raises UsageError naming every bad line. Blank lines and `#`
    comments are skipped; a header line `t_ms,action,node` (any spelling) is allowed first."""
    events: list[TraceEvent] = []
    problems: list[str] = []
    up: set[str] = set()
    last_t = 0.0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = [f.strip() for f in line.split(",")]
        if not events and not problems and fields and not fields[0].lstrip("-").isdigit():
            continue  # a header
        if len(fields) != 3:
            problems.append(f"line {number}: {len(fields)} fields, want t_ms,add|remove,node")
            continue
        t_text, action, node = fields
        if not t_text.isdigit():
            problems.append(f"line {number}: time {t_text[:20]!r} is not whole milliseconds >= 0")
            continue
        t_s = int(t_text) / 1000.0
        if action not in ACTIONS:
            problems.append(f"line {number}: action {action[:20]!r} is not add or remove")
            continue
        if not node or len(node) > 255 or any(c.isspace() or not c.isprintable() for c in node):
            problems.append(f"line {number}: node name {node[:20]!r} is not a plain name")
            continue
        if t_s < last_t:
            problems.append(f"line {number}: time goes back ({t_text} ms after {last_t * 1000:g})")
            continue
        if action == "add" and node in up:
            problems.append(f"line {number}: {node} is added while it is up")
            continue
        if action == "remove" and node not in up:
            problems.append(f"line {number}: {node} is removed while it is not up")
            continue
        (up.add if action == "add" else up.discard)(node)
        last_t = t_s
        events.append(TraceEvent(t_s, action, node))
    if not events and not problems:
        problems.append("no events (want lines of t_ms,add|remove,node)")
    if problems:
        shown = problems[:MAX_PROBLEMS_SHOWN]
        more = len(problems) - len(shown)
        raise UsageError(
            f"{path} is not an availability trace: "
            + "; ".join(shown)
            + (f"; and {more} more" if more else ""),  # fmt: skip
            hint="one event a line: t_ms,add|remove,node (see ../shared/traces/README.md)",
        )
    return Trace(path, tuple(events))


def read_trace(path: Path) -> Trace:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_TRACE_BYTES + 1)
    except OSError as e:
        raise UsageError(
            f"cannot read the trace {path}: {e.strerror or e}", hint="check the path"
        ) from None
    if len(data) > MAX_TRACE_BYTES:
        raise UsageError(f"{path} is over {MAX_TRACE_BYTES >> 20} MiB: not a trace")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path} is not UTF-8 text (byte {e.start})") from None
    return parse_trace(text, path=str(path))
