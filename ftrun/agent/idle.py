"""The zero-config hang guard, agent side: which ranks of this host use ~no CPU and write nothing.

A script that neither calls `ftrun.step()` nor matches `--progress-regex` gives the step-based
hang detector (hang.py) nothing to go by. What every process shows, though, is CPU time and
output. A rank is *idle* from the last sample in which its process tree (the rank and its
descendants, e.g. data-loader workers) used more than IDLE_CPU_FRACTION of one core or its log
file grew; ranks that report steps, or sit in a declared section, are exempt (they have the
step-based detector, or a pause on purpose).

The agent reports its host as idle to the controller only once *every* live rank here has been
idle for `report_after_s(timeout)` (hysteresis: a rank that prints every few seconds costs no
messages), and busy again as soon as one is not. The controller combines the hosts
(controller/stall.py): a job with one busy host is not idle.

The same samples are the evidence for a hang verdict on ranks that do report steps
(verdict.py): once a rank is past its allowance, the host is sampled every
SUSPECT_INTERVAL_S and reports itself idle, with `overdue`, as soon as every live rank here has
waited `confirm_s` together; and a rank's process state (stopped, runnable) is read too.

`IdleTracker` is pure (the caller passes the clock and the samples); `sample_cpu` reads the
process trees with psutil, off the event loop.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psutil

IDLE_CPU_FRACTION = 0.02  # of one core, per rank process tree
# CPU time is counted in clock ticks (10 ms): at a few samples a second, one stray tick of a
# waiting rank's background thread is no sign of work; two are.
IDLE_CPU_MIN_S = 0.015
SUSPECT_INTERVAL_S = 0.25  # how often to sample while a rank is past its allowance


def sample_interval_s(timeout_s: float) -> float:
    """How often to sample: a twentieth of the window, between 0.25 s and 5 s."""
    return min(5.0, max(0.25, timeout_s / 20))


def report_after_s(timeout_s: float) -> float:
    """How long every rank of the host must have been idle before the host says so."""
    return min(60.0, max(0.5, timeout_s / 4))


@dataclass
class _RankIdle:
    t: float
    cpu_s: float
    out_bytes: int
    since: float  # last time the rank was seen busy (or first seen)


class IdleTracker:
    """Per rank of one host: since when it has used no CPU and written nothing."""

    def __init__(self, *, cpu_fraction: float = IDLE_CPU_FRACTION) -> None:
        self.cpu_fraction = cpu_fraction
        self.ranks: dict[int, _RankIdle] = {}

    def observe(
        self,
        rank: int,
        now: float,
        *,
        cpu_s: float,
        out_bytes: int,
        exempt: bool = False,
        running: bool = False,
    ) -> None:
        """One sample of a live rank. `exempt`: it made progress since the last sample, or is in
        a declared section; `running`: its process was runnable (wants CPU it may not get on a
        busy machine)."""
        r = self.ranks.get(rank)
        if r is None:
            self.ranks[rank] = _RankIdle(now, cpu_s, out_bytes, since=now)
            return
        dt = now - r.t
        busy = (
            exempt
            or running
            or out_bytes != r.out_bytes
            or (dt > 0 and cpu_s - r.cpu_s > max(IDLE_CPU_MIN_S, self.cpu_fraction * dt))
        )
        if busy:
            r.since = now
        r.t, r.cpu_s, r.out_bytes = now, cpu_s, out_bytes

    def busy(self) -> set[int]:
        """The ranks seen busy at their last sample."""
        return {rank for rank, r in self.ranks.items() if r.since == r.t}

    def idle_since(self, rank: int) -> float | None:
        """When the rank was last seen busy (or first seen); None for a rank not sampled."""
        r = self.ranks.get(rank)
        return None if r is None else r.since

    def forget(self, rank: int) -> None:
        self.ranks.pop(rank, None)

    def host_idle(self, now: float, live: set[int], *, min_s: float) -> dict[int, float] | None:
        """Seconds each live rank has been idle, when all of them have been for at least min_s;
        None when one is busy, not sampled yet, or there is no live rank."""
        if not live or not live <= self.ranks.keys():
            return None
        idle = {rank: now - self.ranks[rank].since for rank in live}
        return idle if min(idle.values()) >= min_s else None


class IdleGuard:
    """One generation on one host: samples in, a report out when the host's state flips. With
    `timeout_s` 0 the zero-config guard is off, and the host reports only a suspected hang."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.interval_s = sample_interval_s(timeout_s) if timeout_s > 0 else None
        self.tracker = IdleTracker()
        # What the controller was last told: idle (True) or busy, and whether past an allowance.
        self.reported: tuple[bool, bool] = (False, False)

    def update(
        self,
        now: float,
        cpu: dict[int, float],
        out: dict[int, int],
        *,
        exempt: set[int],
        finishing: bool,
        running: set[int] = frozenset(),  # type: ignore[assignment]
        stepping: bool = False,
        overdue: bool = False,
        confirm_s: float = 1.0,
    ) -> tuple[bool, dict[int, float] | None]:
        """Take one sample of the live ranks (`cpu` has exactly them). `stepping`: ranks here
        report steps (the zero-config guard is not theirs); `overdue`: a rank here is past its
        hang allowance (then every rank waiting `confirm_s` is enough to say so).
        Returns (tell the controller?, seconds each rank has been idle, or None for busy)."""
        for rank in self.tracker.ranks.keys() - cpu.keys():
            self.tracker.forget(rank)
        for rank, cpu_s in cpu.items():
            self.tracker.observe(
                rank,
                now,
                cpu_s=cpu_s,
                out_bytes=out.get(rank, 0),
                exempt=rank in exempt,
                running=rank in running,
            )
        if overdue:
            min_s: float | None = confirm_s
        elif self.timeout_s and not stepping:
            min_s = report_after_s(self.timeout_s)
        else:
            min_s = None
        ranks = (
            None
            if finishing or min_s is None
            else self.tracker.host_idle(now, set(cpu), min_s=min_s)
        )
        state = (ranks is not None, overdue and ranks is not None)
        if state == self.reported:
            return False, ranks
        self.reported = state
        return True, ranks


def sample_cpu(pids: dict[int, int]) -> dict[int, float]:
    """CPU seconds used so far by each rank's process tree (sample_ranks)."""
    return sample_ranks(pids)[0]


def sample_ranks(pids: dict[int, int]) -> tuple[dict[int, float], dict[int, str]]:
    """CPU seconds used so far by each rank's process tree: the rank (with its reaped children)
    plus its live descendants; and each rank process's state (psutil's: "running", "sleeping",
    "stopped", "disk-sleep", ...). One pass over the process table. Ranks that are gone are left
    out. Blocking (reads /proc): call it from an executor."""
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    status: dict[int, str] = {}
    wanted = set(pids.values())
    for proc in psutil.process_iter(["ppid", "cpu_times", "status"]):
        info = proc.info
        ct = info.get("cpu_times")
        if ct is None:
            continue
        children.setdefault(info["ppid"], []).append(proc.pid)
        times[proc.pid] = ct.user + ct.system + ct.children_user + ct.children_system
        if proc.pid in wanted:
            status[proc.pid] = str(info.get("status"))
    out, states = {}, {}
    for rank, pid in pids.items():
        if pid not in times:
            continue
        total, stack, seen = 0.0, [pid], set()
        while stack:
            p = stack.pop()
            if p in seen:
                continue
            seen.add(p)
            total += times.get(p, 0.0)
            stack.extend(children.get(p, ()))
        out[rank] = total
        states[rank] = status.get(pid, "unknown")
    return out, states


def output_bytes(directory: Path, ranks: set[int]) -> dict[int, int]:
    """Size of each rank's log file (its stdout and stderr), 0 before it exists."""
    sizes = {}
    for rank in ranks:
        try:
            sizes[rank] = os.stat(directory / f"rank{rank}.log").st_size
        except OSError:
            sizes[rank] = 0
    return sizes
