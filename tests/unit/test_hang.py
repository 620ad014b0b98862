"""Table-driven tests of the hang allowance (DESIGN.md §4), on an injected clock."""

from __future__ import annotations

import pytest

from ftrun.agent.hang import HangPolicy, ProgressTracker

POLICY = HangPolicy(startup_timeout_s=30.0, floor_s=2.0, factor=5.0)


def tracker(expect=True):
    return ProgressTracker(POLICY, expect_progress=expect)


def steps(t: ProgressTracker, rank: int, times: list[float]) -> None:
    for i, now in enumerate(times, start=1):
        t.on_step(rank, i, now)


@pytest.mark.parametrize("now, overdue", [(29.9, []), (30.1, [0])])
def test_startup_allowance_before_the_first_step(now, overdue):
    t = tracker()
    t.on_start(0, 0.0)
    assert [o.rank for o in t.overdue(now)] == overdue


def test_no_startup_allowance_when_progress_is_not_expected():
    t = tracker(expect=False)
    t.on_start(0, 0.0)
    assert t.overdue(10_000.0) == []


@pytest.mark.parametrize(
    "interval, silent, hung",
    [
        (0.01, 1.9, False),
        (0.01, 2.1, True),  # the floor
        (1.0, 4.9, False),
        (1.0, 5.1, True),  # factor x median step time
    ],
)
def test_allowance_after_steps(interval, silent, hung):
    t = tracker()
    times = [10.0 + i * interval for i in range(10)]
    steps(t, 0, times)
    assert bool(t.overdue(times[-1] + silent)) is hung


def test_sections_have_their_own_allowance():
    t = tracker()
    steps(t, 0, [1.0, 1.1, 1.2])
    t.on_section(0, "checkpoint", 60.0, True, 1.3)
    assert t.overdue(50.0) == []
    assert t.overdue(61.4)[0].section == "checkpoint"
    t.on_section(0, "eval", None, True, 62.0)  # no limit
    assert t.overdue(10_000.0) == []


def test_the_rank_that_stopped_first_is_the_culprit():
    t = tracker()
    steps(t, 0, [1.0, 1.1, 1.2, 1.3])
    steps(t, 1, [1.0, 1.1])  # rank 1 stopped first; rank 0 then waited for it
    assert [o.rank for o in t.overdue(10.0)] == [1, 0]


def test_exited_ranks_are_not_hung():
    t = tracker()
    steps(t, 0, [1.0, 1.1])
    t.on_exit(0)
    assert t.overdue(100.0) == []
