"""The pace of a rank, step by step (agent/pace.py): ranks simulated a millisecond at a time on a
fake clock (on a CPU, asleep in a collective, held stopped), read as the agent reads them: the
counts at every step report (at most every MIN_SLICE_S) and at every 50 ms tail tick, with a look
at the state; steps reported as they end (ftrun.step's datagrams) or at the next tick (a
progress regex, which reports the highest step a tick has seen)."""

from __future__ import annotations

import pytest

from ftrun.agent.pace import (
    EVEN_STEPS,
    UNEVEN,
    WAIT_WEIGHT,
    WINDOW_MIN_S,
    Pace,
    PaceMeter,
    middle_mean,
    weighted_median,
)

TICK_MS = 50
# What a rank does for a millisecond: on a CPU, waiting for one, asleep, held stopped; "step":
# a step ends (0 ms).
STATES = {"cpu": "R", "queued": "R", "sleep": "S", "held": "T"}
Plan = list[tuple[str, int]]


def run(plans: dict[int, Plan], *, regex: bool = False) -> dict[int, list[Pace]]:
    """Every rank's plan played at once; the windows each rank's meter reported."""
    cpu = dict.fromkeys(plans, 0)
    queued = dict.fromkeys(plans, 0)
    state = dict.fromkeys(plans, "S")
    meter = PaceMeter(counters=lambda pid: (cpu[pid], queued[pid]), state=lambda pid: state[pid])
    flat = {r: [w for what, ms in plan for w in ([what] if what == "step" else [what] * ms)]
            for r, plan in plans.items()}  # fmt: skip
    steps = dict.fromkeys(plans, 0)
    out: dict[int, list[Pace]] = {r: [] for r in plans}
    for r in plans:
        meter.on_start(r, r)
        meter.on_step(r, 0, 0.0)
    at = dict.fromkeys(plans, 0)
    for ms in range(1, max(len(f) for f in flat.values()) + 1):
        now = ms / 1000
        for r, f in flat.items():
            while at[r] < len(f) and f[at[r]] == "step":  # steps end between milliseconds
                at[r] += 1
                steps[r] += 1
                if not regex and (p := meter.on_step(r, steps[r], now - 0.001)) is not None:
                    out[r].append(p)
            if at[r] < len(f):
                what = f[at[r]]
                at[r] += 1
                state[r] = STATES[what]
                cpu[r] += 10**6 if what == "cpu" else 0
                queued[r] += 10**6 if what == "queued" else 0
        if ms % TICK_MS == 0:  # the tail tick: the logs read (a regex's steps), then a look
            for r in plans:
                if regex and (p := meter.on_step(r, steps[r], now)) is not None:
                    out[r].append(p)
            for r, p in meter.sample(now).items():
                out[r].append(p)
    return out


def steps(n: int, *parts: tuple[str, int]) -> Plan:
    return [part for _ in range(n) for part in (*parts, ("step", 0))]


def test_the_statistics_of_a_window_s_steps() -> None:
    assert weighted_median([(1.0, 1), (9.0, 1), (2.0, 1)]) == 2.0
    assert weighted_median([(3.5, 1), (0.002, 4)]) == 0.002  # one long step of five
    # The middle half: a long step in five (an evaluation) and a short one left out ...
    assert middle_mean([(3.5, 1), (0.001, 1), (0.002, 3)]) == pytest.approx(0.002)
    # ... and steps measured a tick at a time averaged: 30 ms steps, 50 ms ticks.
    assert middle_mean([(0.015, 4), (0.02, 2), (0.03, 2)]) == pytest.approx(0.0175)
    assert middle_mean([(1.0, 2), (2.0, 2)]) == 1.5
    for stat in (weighted_median, middle_mean):
        with pytest.raises(ValueError):
            stat([])


def test_healthy_ranks_compute_alike_whoever_waits() -> None:
    # 20 ms steps: rank 0 computes 12 ms and waits 8 for rank 1, which computes 20.
    paces = run({0: steps(200, ("cpu", 12), ("sleep", 8)), 1: steps(200, ("cpu", 20))})
    assert len(paces[0]) >= 3 and len(paces[1]) >= 3
    for p in paces[0]:
        assert p.compute_s == pytest.approx(0.012, abs=0.001) and p.wall_s >= WINDOW_MIN_S
    assert all(p.compute_s == pytest.approx(0.020, abs=0.001) for p in paces[1])


@pytest.mark.parametrize("regex", [False, True])
def test_an_evaluation_every_few_steps_on_rank_0_does_not_make_it_slow(regex: bool) -> None:
    """Steps of 30 ms; every 10 steps rank 0 evaluates for 2 s while rank 1 waits. Each
    window holds an evaluation (2 s of rank 0's compute, none of rank 1's): the median step
    does not."""
    cycle = steps(10, ("cpu", 20), ("sleep", 10))
    paces = run({0: (cycle + [("cpu", 2000)]) * 6, 1: (cycle + [("sleep", 2000)]) * 6},
                regex=regex)  # fmt: skip
    assert len(paces[0]) >= 4 and len(paces[1]) >= 4
    for p in paces[0] + paces[1]:
        assert p.compute_s == pytest.approx(0.020, abs=0.004), p


@pytest.mark.parametrize("regex", [False, True])
def test_an_evaluation_between_steps_faster_than_a_tick_is_no_figure_at_all(regex: bool) -> None:
    """tests/conformance/eval_pause.py's shape: 5 steps of 2 ms, then 3.5 s of evaluation on
    rank 0 while rank 1 waits. A tick holds the evaluation's end, every step and the next
    evaluation's start: no step is measured apart from it, so no window is reported, rather
    than rank 0 at 100x (a false straggler, the bug this is the test of)."""
    burst = steps(5, ("cpu", 2))
    paces = run({0: (burst + [("cpu", 3500)]) * 6, 1: (burst + [("sleep", 3500)]) * 6},
                regex=regex)  # fmt: skip
    for p in paces[0] + paces[1]:  # (with datagrams a window may hold its steps apart)
        assert p.compute_s < 0.01, p


def test_a_rank_held_back_half_the_time_is_slow_on_every_step() -> None:
    """Held stopped 30 ms of every 60 (SIGSTOP/SIGCONT, tests/slowdown.py): its steps take
    twice as long, and the other rank waits half of each."""
    slow = steps(150, ("cpu", 10), ("held", 15), ("cpu", 10), ("held", 15))
    fast = steps(150, ("cpu", 20), ("sleep", 40))
    paces = run({0: fast, 1: slow})
    assert len(paces[1]) >= 5
    for p_fast, p_slow in zip(paces[0][1:], paces[1][1:], strict=False):
        assert p_fast.compute_s == pytest.approx(0.020, abs=0.002)
        assert p_slow.compute_s / p_fast.compute_s > 2.0, (p_fast, p_slow)


def test_a_slow_host_is_not_mistaken_for_uneven_work() -> None:
    """Slowed 3 x from one step to the next (less than UNEVEN): every step counts from the
    first window after."""
    assert UNEVEN > 3
    paces = run({0: steps(100, ("cpu", 20)) + steps(60, ("cpu", 60))})
    after = [p for p in paces[0] if p.step - p.steps > 100]
    assert after and all(p.compute_s == pytest.approx(0.060, abs=0.002) for p in after)


def test_a_declared_section_is_left_out() -> None:
    cpu = {0: 0}
    meter = PaceMeter(counters=lambda pid: (cpu[pid], 0), state=lambda pid: "R")
    meter.on_start(0, 0)
    meter.on_step(0, 0, 0.0)
    got = []
    for step in range(1, 200):  # 20 ms steps; at step 50, a section of 3 steps of 200 ms
        inside = 50 <= step < 53
        if step == 50:
            meter.on_section(0, inside=True)
        cpu[0] += (200 if inside else 20) * 10**6
        now = step * 0.02 + (0.54 if step >= 53 else 0.18 * (step - 49) if inside else 0.0)
        if step == 53:
            meter.on_section(0, inside=False)
        got += [p for p in [meter.on_step(0, step, now), meter.sample(now).get(0)] if p]
    assert len(got) >= 3 and all(p.compute_s == pytest.approx(0.02, abs=1e-3) for p in got)


def test_waiting_for_a_cpu_counts_averaged_over_windows() -> None:
    """On-CPU time shows in its own window; the run-queue wait (which rank the scheduler makes
    wait is chance from second to second) moves the figure by WAIT_WEIGHT a window."""
    plan = steps(100, ("cpu", 20)) + steps(200, ("cpu", 10), ("queued", 10))
    paces = run({0: plan})
    before = [p.compute_s for p in paces[0] if p.step <= 100]
    after = [p.compute_s for p in paces[0] if p.step - p.steps >= 100]
    assert before and all(c == pytest.approx(0.020, abs=1e-3) for c in before)
    # 10 ms on a CPU and 10 waiting for one: the wait is let in a fifth at a time.
    wait = 0.0
    for c in after:
        wait = WAIT_WEIGHT * 0.010 + (1 - WAIT_WEIGHT) * wait
        assert c == pytest.approx(0.010 + wait, abs=1e-3)


def test_a_window_goes_on_until_it_holds_enough_even_steps() -> None:
    """An evaluation of 0.6 s every 4 steps of 60 ms: a cycle leaves a step or two even (its
    neighbours share its slices), so a window spans cycles until it holds EVEN_STEPS."""
    cycle = steps(4, ("cpu", 40), ("sleep", 20))
    paces = run({0: (cycle + [("cpu", 600)]) * 12, 1: (cycle + [("sleep", 600)]) * 12})
    assert paces[0] and len(paces[0]) == len(paces[1])
    for p in paces[0] + paces[1]:
        assert p.steps > EVEN_STEPS and p.compute_s == pytest.approx(0.040, abs=0.005), p
