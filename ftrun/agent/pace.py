"""Each rank's pace: of the time between its steps, how much it computed and how much it waited.

In data parallelism every rank waits at each step's all-reduce for the slowest one, so the step
time hides which rank that is. What differs is the waiting: a fast rank sleeps in the collective
(its main thread in state S), the slow one hardly does (R: running or runnable, D: in I/O, T:
held stopped). So the agent samples each rank's main thread's state (`/proc/PID/stat`, a few
microseconds a read) every tail tick (50 ms), and over a window of steps reports, per rank:

    compute_s = (share of samples not sleeping) x (wall time of the window) / steps

which is the rank's own time per step: the same on every rank of a healthy job (the machine's
load included), higher on the rank of a slow host (throttled, thermally limited, a noisy
neighbour), whichever rank waits for whom. The controller compares hosts (controller/pace.py).

What it cannot see, said where it is documented (docs/policy.md, *Stragglers*): a rank that
waits on its own data-loader workers sleeps too (a slow disk on one host looks fast); under NCCL
the host thread may spin while the GPU works (every rank R: no difference to see). A window in
which the rank was inside a declared section (`ftrun.section`: an evaluation, a save) is not
reported: that work is not every rank's.
"""

from __future__ import annotations

from dataclasses import dataclass

WINDOW_STEPS = 10  # steps per window at least ...
WINDOW_MIN_S = 5.0  # ... and at least this long: 100 samples, a few percent of noise
BUSY_STATES = frozenset("RDT")  # running or runnable, in I/O, held stopped: not waiting


@dataclass
class Window:
    step: int
    t: float
    busy: int = 0
    samples: int = 0
    in_section: bool = False


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


class PaceMeter:
    def __init__(self) -> None:
        self.pids: dict[int, int] = {}
        self.windows: dict[int, Window] = {}
        self.sections: set[int] = set()  # ranks inside a declared section now

    def on_start(self, rank: int, pid: int) -> None:
        self.pids[rank] = pid

    def on_exit(self, rank: int) -> None:
        self.pids.pop(rank, None)
        self.windows.pop(rank, None)

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
            window.in_section |= rank in self.sections

    def on_step(self, rank: int, step: int, now: float) -> Pace | None:
        """The rank finished `step`: a finished window's pace, when one is due."""
        window = self.windows.get(rank)
        if window is None or step <= window.step:
            if window is None:
                self.windows[rank] = Window(step, now, in_section=rank in self.sections)
            return None
        steps, wall = step - window.step, now - window.t
        if steps < WINDOW_STEPS or wall < WINDOW_MIN_S:
            return None
        self.windows[rank] = Window(step, now, in_section=rank in self.sections)
        if window.in_section or window.samples < 10:
            return None  # not every rank's work, or too few looks to tell
        share = window.busy / window.samples
        return Pace(step, steps, round(wall, 3), round(share * wall / steps, 4))
