"""Each rank's pace: of the time between its steps, how much it computed and how much it waited.

In data parallelism every rank waits at each step's all-reduce for the slowest one, so the step
time hides which rank that is. What differs is the waiting: a fast rank sleeps in the collective
(its main thread in state S), the slow one hardly does (running or runnable, in I/O, or held
stopped). So the agent measures, per rank and over a window of steps, its main thread's busy
time and reports

    compute_s = (busy time in the window) / steps

which is the rank's own time per step: the same on every rank of a healthy job (the machine's
load included), higher on the rank of a slow host (throttled, thermally limited, a noisy
neighbour), whichever rank waits for whom. The controller compares hosts (controller/pace.py).

Busy time is counted, not guessed, where the kernel counts it: `/proc/PID/schedstat` holds the
thread's nanoseconds on a CPU and waiting on a run queue, exact however short the window. Time
in I/O (D) or held stopped (T) is not there, so it is sampled: the thread's state letter is read
every tail tick (50 ms, a few microseconds a read) and that share of the window's wall time is
added. Counting is what lets a window be short (1 s): sampled alone, 20 looks at a state that
changes every few tens of ms put ±20 % of noise on each window, enough for a healthy host to
look 1.3 x slow now and then.

The run-queue wait is the one part that is noisy however it is measured: on a busy machine
(`stress-ng` beside the job) the ranks wait for a CPU two or three times as long as they use
one, and which rank the scheduler makes wait changes from second to second (±19 % on 1 s
windows; on-CPU time alone: ±6 %). It is real slowness when it lasts (a host whose CPUs are
contended), so it is kept, averaged over windows: each window adds WAIT_WEIGHT of its own wait
to (1 - WAIT_WEIGHT) of the average so far (about the last 5 windows). So

    compute_s = on-CPU + held (this window) + run-queue wait (averaged), a step

and a throttled CPU or a held rank shows in its first window, contention in a few. Without
schedstat (a kernel built without it) every busy state is sampled, as before.

What it cannot see, said where it is documented (docs/policy.md, *Stragglers*): a rank that
waits on its own data-loader workers sleeps too (a slow disk on one host looks fast); under NCCL
the host thread may spin while the GPU works (every rank busy: no difference to see). A window in
which the rank was inside a declared section (`ftrun.section`: an evaluation, a save) is not
reported: that work is not every rank's.
"""

from __future__ import annotations

from dataclasses import dataclass

WINDOW_STEPS = 3  # steps per window at least ...
WINDOW_MIN_S = 1.0  # ... and at least this long (the controller's rounds, controller/pace.py)
MIN_SAMPLES = 10  # looks at the thread a window needs: fewer, and the agent was not looking
BUSY_STATES = frozenset("RDT")  # running or runnable, in I/O, held stopped: not waiting
HELD_STATES = frozenset("DT")  # busy, yet not in schedstat's counts: sampled
WAIT_WEIGHT = 0.2  # the newest window's share of the averaged run-queue wait


@dataclass
class Window:
    step: int
    t: float
    counted: tuple[int, int] | None  # schedstat at the start: on-CPU, run-queue ns (None: none)
    busy: int = 0  # samples in a BUSY_STATE
    held: int = 0  # samples in a HELD_STATE
    samples: int = 0
    in_section: bool = False

    def parts(
        self, counted: tuple[int, int] | None, steps: int, wall_s: float
    ) -> tuple[float, float | None]:
        """Seconds a step (own, waiting for a CPU): own is on a CPU (counted) plus held
        (sampled); without schedstat, own is every busy state sampled and the wait None."""
        if self.counted is None or counted is None:
            return self.busy / self.samples * wall_s / steps, None
        on_cpu_s = (counted[0] - self.counted[0]) / 1e9
        wait_s = (counted[1] - self.counted[1]) / 1e9
        return (on_cpu_s + self.held / self.samples * wall_s) / steps, wait_s / steps


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


class PaceMeter:
    def __init__(self, *, window_min_s: float = WINDOW_MIN_S) -> None:
        self.window_min_s = window_min_s
        self.pids: dict[int, int] = {}
        self.windows: dict[int, Window] = {}
        self.sections: set[int] = set()  # ranks inside a declared section now
        self.waits: dict[int, float] = {}  # rank → run-queue wait a step, averaged

    def on_start(self, rank: int, pid: int) -> None:
        self.pids[rank] = pid

    def on_exit(self, rank: int) -> None:
        self.pids.pop(rank, None)
        self.windows.pop(rank, None)
        self.waits.pop(rank, None)

    def on_section(self, rank: int, inside: bool) -> None:
        if inside:
            self.sections.add(rank)
            if (w := self.windows.get(rank)) is not None:
                w.in_section = True
        else:
            self.sections.discard(rank)

    def sample(self) -> None:
        """One look at every rank that has a window open (a tail tick)."""
        for rank, window in self.windows.items():
            pid = self.pids.get(rank)
            state = thread_state(pid) if pid is not None else None
            if state is None:
                continue
            window.samples += 1
            window.busy += state in BUSY_STATES
            window.held += state in HELD_STATES
            window.in_section |= rank in self.sections

    def on_step(self, rank: int, step: int, now: float) -> Pace | None:
        """The rank finished `step`: a finished window's pace, when one is due."""
        window = self.windows.get(rank)
        if window is None or step <= window.step:
            if window is None:
                self.windows[rank] = self._open(rank, step, now)
            return None
        steps, wall = step - window.step, now - window.t
        if steps < WINDOW_STEPS or wall < self.window_min_s:
            return None
        self.windows[rank] = nxt = self._open(rank, step, now)
        if window.in_section or window.samples < MIN_SAMPLES:
            return None  # not every rank's work, or the agent hardly looked
        own_s, wait_s = window.parts(nxt.counted, steps, wall)
        if wait_s is not None:
            last = self.waits.get(rank, wait_s)
            wait_s = self.waits[rank] = WAIT_WEIGHT * wait_s + (1 - WAIT_WEIGHT) * last
        # Two clocks and an average: never more busy than the steps took.
        compute_s = min(own_s + (wait_s or 0.0), wall / steps)
        return Pace(step, steps, round(wall, 3), round(compute_s, 4))

    def _open(self, rank: int, step: int, now: float) -> Window:
        pid = self.pids.get(rank)
        counted = sched_ns(pid) if pid is not None else None
        return Window(step, now, counted, in_section=rank in self.sections)
