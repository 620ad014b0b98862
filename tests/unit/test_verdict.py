"""Hang verdicts from evidence (agent/verdict.py, agent/hang.py's learned rhythm, and the
deadlock and teardown joins of controller/stall.py), on an injected clock: a rank past its
allowance is only suspected; what the ranks are doing decides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ftrun.agent.hang import HangPolicy, Overdue, ProgressTracker
from ftrun.agent.idle import IdleGuard
from ftrun.agent.verdict import gloo_exit_race, in_teardown, local_verdict
from ftrun.controller.stall import AskStacks, Idle, StallWatch, Teardown
from ftrun.wire.inbound import Stacks

POLICY = HangPolicy(floor_s=2.0, factor=5.0, busy_floor_s=60.0, confirm_s=1.0)


def tracker_with_steps(gaps: list[float], rank: int = 0) -> tuple[ProgressTracker, float]:
    """A tracker whose rank stepped after each gap; returns it and the time of the last step."""
    t = ProgressTracker(POLICY, expect_progress=True)
    now = 0.0
    t.on_start(rank, now)
    for step, gap in enumerate([0.1, *gaps]):
        now += gap
        t.on_step(rank, step, now)
    return t, now


def test_a_periodic_long_interval_is_learned_the_first_time_and_allowed_after():
    quick, last = tracker_with_steps([0.1] * 10)
    assert [o.rank for o in quick.overdue(last + 2.5)] == [0]  # 2 s floor: suspected
    learned, last = tracker_with_steps([0.1] * 10 + [6.0] + [0.1] * 10)
    assert learned.overdue(last + 8.0) == []  # 1.5 x the 6 s seen: the job's own rhythm
    assert [o.rank for o in learned.overdue(last + 9.5)] == [0]
    # the base allowance (for a stopped rank) ignores what was learned
    assert [o.rank for o in learned.overdue(last + 2.5, learned=False)] == [0]


def overdue(rank: int, since: float = 0.0, allowance: float = 2.0, section=None) -> Overdue:
    return Overdue(rank, 5, since, allowance, section, allowance)


VERDICTS = [
    # (name, overdue ranks, stopped, busy, now, expected (culprit, why) or None)
    ("waiting while a peer computes: no verdict here", [0], set(), {1}, 30.0, None),
    ("every rank waiting: not this host's verdict", [0, 1], set(), set(), 30.0, None),
    ("a stopped rank is the culprit", [0, 1], {1}, set(), 3.0, (1, "stopped")),
    ("stopped before anyone is due: nothing yet", [], {1}, set(), 1.0, None),
    ("computing past its allowance: not before the busy floor", [0], set(), {0}, 59.0, None),
    ("computing past the busy floor: spinning", [0], set(), {0}, 61.0, (0, "spinning")),
]


@pytest.mark.parametrize(("name", "late", "stopped", "busy", "now", "expected"), VERDICTS)
def test_local_verdicts(name, late, stopped, busy, now, expected):
    ranks = [overdue(r) for r in late]
    found = local_verdict(ranks, ranks, stopped=stopped, busy=busy, now=now, policy=POLICY)
    assert (None if found is None else (found.culprit.rank, found.why)) == expected, name


def test_a_section_past_its_own_timeout_is_a_hang_whatever_the_evidence():
    late = [overdue(0, allowance=1.0, section="eval")]
    found = local_verdict(late, late, stopped=set(), busy=set(), now=2.0, policy=POLICY)
    assert found is not None and found.why == "section"


def test_a_host_reports_waiting_past_an_allowance_after_confirm_s_not_the_idle_timeout():
    guard = IdleGuard(timeout_s=0)  # the zero-config guard off: only a suspicion is reported
    kw = dict(exempt=set(), finishing=False, stepping=True, confirm_s=1.0)
    assert guard.update(0.0, {0: 1.0, 1: 1.0}, {}, overdue=True, **kw) == (False, None)
    assert guard.update(0.5, {0: 1.0, 1: 1.0}, {}, overdue=True, **kw) == (False, None)
    tell, ranks = guard.update(1.0, {0: 1.0, 1: 1.0}, {}, overdue=True, **kw)
    assert tell and ranks == {0: 1.0, 1: 1.0}
    # a rank that computes again (CPU) makes the host busy at once
    tell, ranks = guard.update(1.25, {0: 1.2, 1: 1.0}, {}, overdue=True, **kw)
    assert tell and ranks is None
    # stepping ranks that merely wait, not past any allowance, are not the idle guard's
    assert guard.update(9.0, {0: 1.2, 1: 1.0}, {}, overdue=False, **kw) == (False, None)


def test_a_runnable_rank_is_busy_even_without_cpu_on_a_starved_machine():
    guard = IdleGuard(timeout_s=0)
    kw = dict(exempt=set(), finishing=False, stepping=True, overdue=True, confirm_s=1.0)
    guard.update(0.0, {0: 1.0}, {}, **kw)
    assert guard.update(2.0, {0: 1.0}, {}, running={0}, **kw) == (False, None)


A, B = "agent-a", "agent-b"


def reply(fields: dict[str, Any]) -> Stacks:
    """An agent's `stacks` answer, as the server hands it on."""
    return Stacks(gen=1, **fields)


def stall(agents=(A, B)) -> StallWatch:
    return StallWatch(
        set(agents), exit_timeout_s=60.0, idle_timeout_s=0.0, stacks_timeout_s=10.0, confirm_s=1.0
    )


def test_a_deadlock_needs_every_host_waiting():
    w = stall()
    w.on_idle(A, {0: 1.0}, 100.0, overdue={0: 2.0})
    assert w.poll(200.0) is None  # B still computes (it has not said it is idle)
    w.on_idle(B, {1: 1.5}, 100.2, overdue=None)
    ask = w.poll(100.2)
    assert isinstance(ask, AskStacks)
    w.on_stacks(A, reply({"stacks": {"0": "File x.py, line 3 in all_reduce"}}))
    w.on_stacks(B, reply({"stacks": {"1": "File x.py, line 3 in all_reduce"}}))
    found = w.poll(100.3)
    assert isinstance(found, Idle) and found.overdue == {0: 2.0}


def test_a_host_that_computes_again_calls_the_deadlock_off():
    w = stall()
    w.on_idle(A, {0: 1.0}, 100.0, overdue={0: 2.0})
    w.on_idle(B, {1: 0.2}, 100.0)
    w.on_idle(B, None, 100.1)  # B's rank computes again
    assert w.poll(105.0) is None and w.wakeup() is None


def test_every_rank_in_teardown_is_not_a_hang_but_the_exit_barrier():
    w = stall()
    w.on_idle(A, {0: 1.0}, 100.0, overdue={0: 2.0})
    w.on_idle(B, {1: 1.0}, 100.0, overdue={1: 2.0})
    assert isinstance(w.poll(100.0), AskStacks)
    torn = "File distributed_c10d.py, line 2 in destroy_process_group\n  File t.py in main"
    w.on_stacks(A, reply({"stacks": {"0": torn}}))
    w.on_stacks(B, reply({"stacks": {"1": "no stacks: the process is sleeping and ..."}}))
    found = w.poll(100.1)
    assert isinstance(found, Teardown) and found.ranks == [0]
    w.on_teardown(found.rank, "host-a", 100.1)
    assert w.finishing and w.teardown and w.deadline == pytest.approx(160.1)


def test_one_rank_in_teardown_and_one_in_training_is_a_hang():
    w = stall()
    w.on_idle(A, {0: 1.0}, 100.0, overdue={0: 2.0})
    w.on_idle(B, {1: 1.0}, 100.0, overdue={1: 2.0})
    w.poll(100.0)
    w.on_stacks(A, reply({"stacks": {"0": "in destroy_process_group"}}))
    w.on_stacks(B, reply({"stacks": {"1": "in all_reduce\n  in train_step"}}))
    assert isinstance(w.poll(100.1), Idle)


@pytest.mark.parametrize(
    ("text", "torn"),
    [
        ('File "c10d.py", line 9 in destroy_process_group', True),
        ('File "/usr/lib/python3.11/threading.py", line 1583 in _shutdown', True),
        ('File "train.py", line 3 in server_shutdown', False),
        ('File "train.py", line 30 in evaluate', False),
    ],
)
def test_teardown_is_read_from_the_frames(text, torn):
    assert bool(in_teardown({"0": text})) is torn


RACE_DUMP = Path(__file__).resolve().parent.parent / "data" / "gloo_exit_race.pyspy.txt"


def test_torchs_gloo_exit_deadlock_is_read_off_a_real_native_dump():
    """A `py-spy dump --native` of a warm rank stuck at exit (torch 2.13, this machine): the
    main thread joins in ~ProcessGroupGloo, a gloo worker waits for the GIL in
    ~ThreadLocalState. Either half alone is an ordinary wait."""
    text = RACE_DUMP.read_text()
    assert gloo_exit_race(text)
    main_only = text.split("Thread", 2)[0] + "Thread" + text.split("Thread", 2)[1]
    assert not gloo_exit_race(main_only)
    assert not gloo_exit_race(text.replace("~ProcessGroupGloo", "allreduce"))


def test_every_host_stuck_in_the_exit_race_ends_the_barrier_at_once():
    w = stall()
    assert w.on_clean_exit(0, "host-a", 100.0)  # rank 0 exited 0: 60 s barrier
    w.on_agent_done(A)
    assert not w.on_exit_race(B, 1, "host-b", 103.0)
    assert w.deadline == 103.0 and isinstance(w.poll(103.0), AskStacks)


def test_the_exit_race_on_one_host_leaves_the_others_their_barrier():
    w = stall()
    assert w.on_exit_race(A, 0, "host-a", 100.0)  # nobody exited 0 yet: the barrier starts
    assert w.finishing and w.deadline == pytest.approx(160.0)
    w.on_exit_race(B, 1, "host-b", 101.0)
    assert w.deadline == 101.0


def test_with_no_busy_floor_a_spin_is_caught_at_its_learned_allowance():
    """`busy_floor_s = 0` (docs/policy.md): a rank computing past the allowance its job's rhythm
    taught (1.5 x a 6 s evaluation = 9 s) is a hang there, not at 60 s."""
    eager = HangPolicy(floor_s=2.0, factor=5.0, busy_floor_s=0.0, confirm_s=1.0)
    learned, last = tracker_with_steps([0.1] * 10 + [6.0] + [0.1] * 10)
    assert learned.overdue(last + 8.5) == []
    late = learned.overdue(last + 9.5)
    found = local_verdict(late, late, stopped=set(), busy={0}, now=last + 9.5, policy=eager)
    assert found is not None and (found.culprit.rank, found.why) == (0, "spinning")
    assert local_verdict(late, late, stopped=set(), busy={0}, now=last + 9.5, policy=POLICY) is None
