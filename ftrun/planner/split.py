"""Contiguous split of L layers into k stages that minimises the slowest stage, memory-aware.

The exact answer, for any k ≤ L (not only divisors of L): a binary search over the O(L²) possible
stage times finds the smallest bound T for which some split keeps every stage at most T and
fitting memory (a reachability sweep over layer boundaries, stage by stage, since a stage's
memory depends on its position in the pipeline); then, among the splits within T, a dynamic
program picks the most even one (least sum of squared stage times) and, of those, the one with
the heavier stages last — under 1F1B the first stage holds the most micro-batches in flight.
At the sizes that matter (L up to a few hundred) this is milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import accumulate

# fits(stage_index, start, end) → whether layers [start, end) fit as that stage.
Fits = Callable[[int, int, int], bool]
Stages = tuple[tuple[int, int], ...]


def balanced_split(times: Sequence[float], k: int, *, fits: Fits | None = None) -> Stages | None:
    """Half-open ranges of `k` contiguous, non-empty stages covering every layer, the slowest as
    fast as possible; None when no split satisfies `fits`."""
    n = len(times)
    if not 1 <= k <= n:
        raise ValueError(f"cannot split {n} layers into {k} stages")
    if fits is not None:
        fits = _remembered(fits)  # the binary search asks the same stages again
    prefix = [0.0, *accumulate(times)]
    bounds = sorted({prefix[j] - prefix[i] for i in range(n) for j in range(i + 1, n + 1)})
    if not _reachable(prefix, k, bounds[-1], fits):
        return None
    lo, hi = 0, len(bounds) - 1  # bounds[hi] is feasible
    while lo < hi:
        mid = (lo + hi) // 2
        if _reachable(prefix, k, bounds[mid], fits):
            hi = mid
        else:
            lo = mid + 1
    return _most_even(prefix, k, bounds[lo], fits)


def _remembered(fits: Fits) -> Fits:
    known: dict[tuple[int, int, int], bool] = {}

    def remembered(stage: int, start: int, end: int) -> bool:
        key = (stage, start, end)
        if key not in known:
            known[key] = fits(stage, start, end)
        return known[key]

    return remembered


def _reachable(prefix: Sequence[float], k: int, bound: float, fits: Fits | None) -> bool:
    """Whether k stages, each at most `bound` and fitting, can end exactly at the last layer."""
    n = len(prefix) - 1
    reach = [0]
    for s in range(k):
        last = n - (k - s - 1)  # leave a layer for each stage after this one
        seen: set[int] = set()
        for i in reach:
            for j in range(i + 1, last + 1):
                if prefix[j] - prefix[i] > bound:
                    break
                if j not in seen and (fits is None or fits(s, i, j)):
                    seen.add(j)
        reach = sorted(seen)
        if not reach:
            return False
    return reach[-1] == n


def _most_even(prefix: Sequence[float], k: int, bound: float, fits: Fits | None) -> Stages:
    """Among splits with every stage at most `bound`, the least sum of squared stage times."""
    n = len(prefix) - 1
    inf = float("inf")
    cost: dict[int, float] = {0: 0.0}
    parents: list[dict[int, int]] = []
    for s in range(k):
        last = n - (k - s - 1)
        nxt: dict[int, float] = {}
        parent: dict[int, int] = {}
        for i in sorted(cost):
            for j in range(i + 1, last + 1):
                t = prefix[j] - prefix[i]
                if t > bound:
                    break
                c = cost[i] + t * t
                # Strictly less: of equal splits the earliest parent wins, so later stages are
                # the longer ones.
                if c < nxt.get(j, inf) and (fits is None or fits(s, i, j)):
                    nxt[j] = c
                    parent[j] = i
        cost = nxt
        parents.append(parent)
    assert n in cost, "the bound was checked reachable"
    stages: list[tuple[int, int]] = []
    end = n
    for parent in reversed(parents):
        start = parent[end]
        stages.append((start, end))
        end = start
    return tuple(reversed(stages))


def slowest(times: Sequence[float], stages: Stages) -> float:
    """The largest stage time of a split (for tests and callers that check a split)."""
    prefix = [0.0, *accumulate(times)]
    return max(prefix[end] - prefix[start] for start, end in stages)


__all__ = ["Fits", "Stages", "balanced_split", "slowest"]
