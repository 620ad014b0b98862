"""The balanced split: exact minimum of the slowest stage for any k, memory-aware."""

from __future__ import annotations

import itertools

import pytest

from ftrun.planner.split import Stages, balanced_split, slowest


def brute_force(times: list[float], k: int) -> float:
    """The smallest slowest stage over every contiguous split (for small cases)."""
    n = len(times)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        best = min(best, max(sum(times[a:b]) for a, b in itertools.pairwise(bounds)))
    return best


def sizes(stages: Stages) -> list[int]:
    return [end - start for start, end in stages]


@pytest.mark.parametrize(
    ("times", "k", "shape"),
    [
        ([1.0] * 10, 3, [3, 3, 4]),  # not a divisor: the heavier stage last (1F1B's lightest)
        ([1.0] * 8, 2, [4, 4]),
        ([1.0] * 8, 8, [1] * 8),
        ([1.0] * 5, 1, [5]),
        ([4.0, 1.0, 1.0, 1.0, 1.0], 2, [1, 4]),  # one heavy layer alone
        ([1.0, 1.0, 1.0, 1.0, 4.0], 2, [4, 1]),
        ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3, [3, 2, 1]),  # 6 | 9 | 6: the slowest is 9
    ],
)
def test_shapes(times: list[float], k: int, shape: list[int]) -> None:
    stages = balanced_split(times, k)
    assert stages is not None
    assert sizes(stages) == shape
    assert slowest(times, stages) == brute_force(times, k)


@pytest.mark.parametrize("seed", range(20))
def test_matches_brute_force(seed: int) -> None:
    import random

    rng = random.Random(seed)
    times = [float(rng.randint(1, 20)) for _ in range(rng.randint(1, 9))]
    for k in range(1, len(times) + 1):
        stages = balanced_split(times, k)
        assert stages is not None
        assert slowest(times, stages) == brute_force(times, k)


def test_memory_moves_layers_off_a_stage_that_cannot_hold_them() -> None:
    times = [1.0] * 6
    # Stage 0 may hold at most 2 layers (think: 1F1B's first stage holds the most in flight).
    stages = balanced_split(times, 2, fits=lambda s, i, j: s != 0 or j - i <= 2)
    assert stages == ((0, 2), (2, 6))
    assert balanced_split(times, 2, fits=lambda s, i, j: j - i <= 2) is None


def test_k_out_of_range() -> None:
    with pytest.raises(ValueError):
        balanced_split([1.0, 1.0], 3)
    with pytest.raises(ValueError):
        balanced_split([1.0], 0)
