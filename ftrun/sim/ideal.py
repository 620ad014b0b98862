"""The ideal on a trace: every host up is used at once, at the best plan for that many hosts,
and changing costs nothing. Its goodput is the share of the best plan's throughput on all the
hosts the job wants (`want`) that the hosts up at each moment could give, averaged over time:
what no launcher can beat, so the one to measure against.
"""

from __future__ import annotations

from collections.abc import Callable

from ftrun.planner import Profile, rank_layouts
from ftrun.sim.trace import Trace


def speed_by_hosts(
    want: int,
    *,
    nproc_per_node: int,
    profile: Profile | None,
    global_batch: int | None,
    device_memory_bytes: int | None,
) -> Callable[[int], float]:
    """n hosts → throughput relative to the best plan on `want` hosts: the planner's predicted
    step times in a planned job (the same ranking the controller uses), else DP in proportion
    to the hosts."""
    if profile is None:
        return lambda n: min(n, want) / want
    cache: dict[int, float] = {}

    def best_step_s(n: int) -> float:
        if n not in cache:
            ranked = rank_layouts(
                profile,
                slots=[nproc_per_node] * n,
                global_batch=global_batch or profile.global_batch or 0,
                device_memory_bytes=device_memory_bytes or profile.device_memory_bytes,
                granularity=nproc_per_node,
            )
            cache[n] = ranked[0].step_s if ranked else float("inf")
        return cache[n]

    full = best_step_s(want)
    return lambda n: 0.0 if n <= 0 else min(1.0, full / best_step_s(min(n, want)))


def ideal_goodput(
    trace: Trace, *, start_s: float, end_s: float, speed: Callable[[int], float]
) -> float:
    """Time-averaged speed of the hosts up over [start_s, end_s]."""
    if end_s <= start_s:
        return 0.0
    up: set[str] = set()
    area, t_prev = 0.0, start_s
    for e in trace.events:
        if e.t_s > start_s:
            t = min(e.t_s, end_s)
            area += speed(len(up)) * (t - t_prev)
            t_prev = t
        if e.t_s >= end_s:
            break
        (up.add if e.action == "add" else up.discard)(e.node)
    area += speed(len(up)) * (end_s - t_prev)
    return area / (end_s - start_s)
