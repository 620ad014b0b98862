"""Each rank's pace: of the time between its steps, how much it computed and how much it waited.

In data parallelism every rank waits at each step's all-reduce for the slowest one, so the step
time hides which rank that is. What differs is the waiting: a fast rank sleeps in the collective
(its main thread in state S), the slow one hardly does (running or runnable, in I/O, or held
stopped). So the agent measures each rank's main thread, step by step, and reports over a window
of steps (≥ 1 s, ≥ EVEN_STEPS of them even) its **compute time per step**: the same on every
rank of a healthy job (the machine's load included), higher on the rank of a slow host
(throttled, thermally limited, a noisy neighbour), whichever rank waits for whom. The controller
compares hosts (controller/pace.py).

A step, not a window, is the unit judged. A slow host is slow on nearly every step; uneven work
(rank 0 evaluating, saving or logging every N steps while the others wait) is much compute in a
few steps. So the window's figure is a robust mean of its steps' figures, the **middle half's**
(the interquartile mean: the median's robustness, less its jumps between the values of steps
measured a tick at a time): a periodic evaluation does not move it, a host slow on every step
does.

Counted, not guessed, where the kernel counts: `/proc/PID/schedstat` holds the thread's
nanoseconds on a CPU and waiting on a run queue. It is read when a step is reported (at most
once per MIN_SLICE_S: at a thousand steps a second, a slice holds a few) and at every tail tick
(50 ms), with one look at the thread's state. Between two reads is a *slice*; its steps share
it. A step reported in a slice of its own or first in one also carries the slices before it
with no step (a long step: an evaluation). Steps reported by a progress regex arrive a tick at
a time, so steps faster than a tick are measured a tick at a time, and the tick that holds the
end of an evaluation (and the next one's start) holds a few short steps too. Hence **uneven**:
a step that took UNEVEN x the median of the rank's recent steps (and ≥ UNEVEN_MIN_S), or one
inside a declared section (`ftrun.section`), is left out together with every step that ended in
the slices where it began and ended (their figures hold part of it). A window goes on until it
holds EVEN_STEPS steps left (a few are too few to judge by), or is dropped after WINDOW_MAX_S:
there is nothing even to judge (a script that evaluates every few fast steps, judged by a
progress regex).

Per step, then: on a CPU (counted) + held (the share of the window's looks at state D or T,
I/O or stopped, which schedstat does not count; sampled, so averaged over the window's even
steps and spread by each step's wall time) = its own time; waiting for a CPU (counted) apart,
as its middle mean is **averaged** over windows (each window WAIT_WEIGHT, the average so far the
rest: on a busy machine which rank the scheduler makes wait changes from second to second, ±19 %
on 1 s windows beside `stress-ng`). So

    compute_s = middle(own) + average over windows of middle(run-queue wait), a step

Without schedstat (a kernel built without it) every busy state is sampled instead. What it
cannot see is said in docs/policy.md, *Stragglers*: a rank that waits on its own data-loader
workers sleeps too; under NCCL the host thread may spin while the GPU works.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

WINDOW_STEPS = 3  # steps per window at least ...
WINDOW_MIN_S = 1.0  # ... over at least this long (the controller's rounds, controller/pace.py)
EVEN_STEPS = 8  # even steps a window needs to be reported: until then it goes on ...
WINDOW_MAX_S = 10.0  # ... for this long at most, then is dropped
MIN_SLICE_S = 0.02  # schedstat read at a step report at most this often
MIN_SAMPLES = 10  # looks at the thread a window needs: fewer, and the agent was not looking
BUSY_STATES = frozenset("RDT")  # running or runnable, in I/O, held stopped: not waiting
HELD_STATES = frozenset("DT")  # busy, yet not in schedstat's counts: sampled
WAIT_WEIGHT = 0.2  # the newest window's share of the averaged run-queue wait
UNEVEN = 4.0  # a step this many times the median of the recent ones is uneven work ...
UNEVEN_MIN_S = 0.1  # ... if it is at least this long
RECENT = 16  # the recent steps (entries) an uneven one is judged against


@dataclass(frozen=True)
class Part:
    """A stretch of a rank's time: wall, on a CPU and waiting for one (s, counted); the looks at
    its state (busy, held: of `samples`); `apart`: a declared section touched it."""

    wall: float = 0.0
    cpu: float = 0.0
    wait: float = 0.0
    samples: float = 0.0
    busy: float = 0.0
    held: float = 0.0
    apart: bool = False

    def plus(self, other: Part) -> Part:
        return Part(self.wall + other.wall, self.cpu + other.cpu, self.wait + other.wait,
                    self.samples + other.samples, self.busy + other.busy,
                    self.held + other.held, self.apart or other.apart)  # fmt: skip

    def share(self, n: int) -> Part:
        return Part(self.wall / n, self.cpu / n, self.wait / n, self.samples / n, self.busy / n,
                    self.held / n, self.apart)  # fmt: skip


@dataclass
class Entry:
    """`count` steps alike, the last numbered `step`, each `each`; begun in slice `begin` (the
    one the step before ended in) and ended in slice `end`."""

    step: int
    count: int
    each: Part
    begin: int
    end: int
    uneven: bool = False  # uneven itself, or it shares a slice with uneven work: left out


@dataclass(frozen=True)
class Pace:
    """One rank's window: `steps` steps in `wall_s`, of which it computed `compute_s` a step."""

    step: int  # the window's last step
    steps: int
    wall_s: float
    compute_s: float


def thread_state(pid: int) -> str | None:
    """The main thread's state letter, or None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    end = text.rfind(b")")  # the command name may hold spaces and parentheses
    return chr(text[end + 2]) if end != -1 and len(text) > end + 2 else None


def sched_ns(pid: int) -> tuple[int, int] | None:
    """The main thread's nanoseconds on a CPU and waiting on a run queue, or None (gone, or a
    kernel without schedstat)."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as f:
            on_cpu, waiting = f.read().split()[:2]
        return int(on_cpu), int(waiting)
    except (OSError, ValueError):
        return None


def weighted_median(pairs: Iterable[tuple[float, float]]) -> float:
    """The median of values given with weights (a step count each)."""
    ordered = sorted(pairs)
    half, seen = sum(w for _, w in ordered) / 2, 0.0
    for value, weight in ordered:
        seen += weight
        if seen >= half:
            return value
    raise ValueError("no values")


def middle_mean(pairs: Iterable[tuple[float, float]]) -> float:
    """The mean of the middle half of values given with weights (the interquartile mean): as
    deaf as the median to a quarter of the steps far out either way, but where steps are
    measured a tick at a time (a step's share of a tick: 15, 20 or 30 ms for 30 ms steps), an
    average of the middle ones, not one of them."""
    ordered = sorted(pairs)
    total = sum(w for _, w in ordered)
    if total <= 0:
        raise ValueError("no values")
    low, high, seen, acc = total / 4, 3 * total / 4, 0.0, 0.0
    for value, weight in ordered:
        inside = min(seen + weight, high) - max(seen, low)  # this value's weight in the middle
        acc += value * max(inside, 0.0)
        seen += weight
    return acc / (high - low)


@dataclass
class Stream:
    """One rank's steps as measured: the slice open since the last read, the steps not yet
    judged (those of the last slice with steps: the next step may prove them uneven's
    neighbours), and the window's judged ones."""

    pid: int
    step: int
    t: float  # the last read
    t_step: float  # the last read at a step report (the cap is on these)
    counted: tuple[int, int] | None  # schedstat then (None: not counted on this kernel)
    looks: Part = field(default_factory=Part)  # the open slice's looks at the thread
    steps: int = 0  # steps reported in the open slice
    slices: int = 0
    before: Part = field(default_factory=Part)  # slices with no step since the last with one
    last: int = 0  # the last slice with a step
    pending: list[Entry] = field(default_factory=list)
    window: list[Entry] = field(default_factory=list)
    bad: set[int] = field(default_factory=set)  # slices that hold part of an uneven step
    recent: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=RECENT))


class PaceMeter:
    def __init__(
        self,
        *,
        window_min_s: float = WINDOW_MIN_S,
        counters: Callable[[int], tuple[int, int] | None] | None = None,
        state: Callable[[int], str | None] | None = None,
    ) -> None:
        self.window_min_s = window_min_s
        self.counters = counters or sched_ns
        self.state = state or thread_state
        self.pids: dict[int, int] = {}
        self.streams: dict[int, Stream] = {}
        self.sections: set[int] = set()  # ranks inside a declared section now
        self.waits: dict[int, float] = {}  # rank → run-queue wait a step, averaged

    def on_start(self, rank: int, pid: int) -> None:
        self.pids[rank] = pid

    def on_exit(self, rank: int) -> None:
        self.pids.pop(rank, None)
        self.streams.pop(rank, None)
        self.waits.pop(rank, None)

    def on_section(self, rank: int, inside: bool) -> None:
        (self.sections.add if inside else self.sections.discard)(rank)
        if (s := self.streams.get(rank)) is not None:
            s.looks = replace(s.looks, apart=True)  # its beginning or end is in this slice

    def sample(self, now: float | None = None) -> dict[int, Pace]:
        """One look at every rank that is measured (a tail tick), and a read of its counts
        unless one was just taken: windows finished by it, by rank."""
        now = time.monotonic() if now is None else now
        done = {}
        for rank, s in list(self.streams.items()):
            state = self.state(s.pid)
            if state is None:
                continue
            s.looks = s.looks.plus(Part(samples=1, busy=state in BUSY_STATES,
                                        held=state in HELD_STATES))  # fmt: skip
            if now - s.t >= MIN_SLICE_S and (pace := self._read(rank, s, now)) is not None:
                done[rank] = pace
        return done

    def on_step(self, rank: int, step: int, now: float) -> Pace | None:
        """The rank reported `step`: a finished window's pace, when one is due."""
        s = self.streams.get(rank)
        if s is None:
            if (pid := self.pids.get(rank)) is not None:
                self.streams[rank] = Stream(pid, step, now, now, self.counters(pid))
            return None
        if step <= s.step:
            return None
        s.steps += step - s.step
        s.step = step
        if now - s.t_step < MIN_SLICE_S:
            return None  # read with the next report, or at the next tick
        s.t_step = now
        return self._read(rank, s, now)

    def _read(self, rank: int, s: Stream, now: float) -> Pace | None:
        """Close the open slice: its steps judged, the steps before them settled."""
        counted = self.counters(s.pid) if s.counted is not None else None
        cpu = wait = 0.0
        if s.counted is not None:
            if counted is None:  # gone (its exit is on its way): nothing more to measure
                del self.streams[rank]
                return None
            cpu, wait = (counted[0] - s.counted[0]) / 1e9, (counted[1] - s.counted[1]) / 1e9
        part = replace(s.looks.plus(Part(now - s.t, cpu, wait)),
                       apart=s.looks.apart or rank in self.sections)  # fmt: skip
        s.t, s.counted, s.looks, s.slices = now, counted, Part(), s.slices + 1
        if s.steps == 0:
            s.before = s.before.plus(part)
            return None
        k, n, s.steps = s.steps, s.slices, 0
        # The first step of the slice ends here, begun in the last slice with a step; the rest
        # began and ended here. Each has its share of this slice.
        first = Entry(s.step - k + 1, 1, s.before.plus(part.share(k)), s.last, n)
        made = [first] + ([Entry(s.step, k - 1, part.share(k), n, n)] if k > 1 else [])
        usual = weighted_median(s.recent) if s.recent else first.each.wall
        for e in made:
            wall = e.each.wall
            if e.each.apart or (wall >= UNEVEN * usual and wall >= UNEVEN_MIN_S):
                s.bad |= {e.begin, e.end}
        # A step's figure holds a share of the slice it ended in: left out where uneven work
        # began or ended there. The pending steps are judged now that the step after them (the
        # only other one that can mark their slice) is known.
        for e in s.pending + made:
            e.uneven |= e.end in s.bad
        s.window += s.pending
        s.pending, s.last, s.before = made, n, Part()
        s.recent.extend((e.each.wall, e.count) for e in made)
        s.bad = {b for b in s.bad if b >= first.begin}
        return self._finish(rank, s)

    def _finish(self, rank: int, s: Stream) -> Pace | None:
        steps = sum(e.count for e in s.window)
        wall = sum(e.each.wall * e.count for e in s.window)
        even = [e for e in s.window if not e.uneven]
        if steps < WINDOW_STEPS or wall < self.window_min_s:
            return None
        if sum(e.count for e in even) < EVEN_STEPS:  # a few steps are too few to judge by
            if wall >= WINDOW_MAX_S:
                s.window = []  # uneven work throughout: nothing to judge
            return None
        window, s.window = s.window, []
        if sum(e.each.samples * e.count for e in window) < MIN_SAMPLES:
            return None  # the agent hardly looked
        return Pace(window[-1].step, steps, round(wall, 3), self._figure(rank, s, even))

    def _figure(self, rank: int, s: Stream, even: list[Entry]) -> float:
        looks = sum(e.each.samples * e.count for e in even) or 1.0
        if s.counted is None:  # nothing counted: every busy state, sampled
            busy = sum(e.each.busy * e.count for e in even) / looks
            own = middle_mean((busy * e.each.wall, e.count) for e in even)
            wait = 0.0
        else:
            held = sum(e.each.held * e.count for e in even) / looks
            own = middle_mean((e.each.cpu + held * e.each.wall, e.count) for e in even)
            wait = middle_mean((e.each.wait, e.count) for e in even)
            last = self.waits.get(rank, wait)
            wait = self.waits[rank] = WAIT_WEIGHT * wait + (1 - WAIT_WEIGHT) * last
        # Two clocks and an average: never more busy than the steps took.
        usual = middle_mean((e.each.wall, e.count) for e in even)
        return round(min(own + wait, usual), 4)
