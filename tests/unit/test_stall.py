"""Table-driven tests of the exit barrier and of the idle guard's cross-host join
(controller/stall.py), on an injected clock."""

from __future__ import annotations

from typing import Any

import pytest

from ftrun.controller.stall import AskStacks, ExitHang, Idle, StallWatch, Why
from ftrun.wire.inbound import Stacks

A, B = "agent-a", "agent-b"


def reply(fields: dict[str, Any]) -> Stacks:
    """An agent's `stacks` answer, as the server hands it on."""
    return Stacks(gen=1, **fields)


def watch(exit_s=60.0, idle_s=0.0, stacks_s=10.0, agents=(A, B)) -> StallWatch:
    return StallWatch(
        set(agents), exit_timeout_s=exit_s, idle_timeout_s=idle_s, stacks_timeout_s=stacks_s
    )


# ---- exit barrier ---------------------------------------------------------------------------

# (events before `now`, now, what poll() says). Events: ("clean", t, rank), ("progress", t),
# ("done", agent). The first clean exit is at t=100 with a 60 s timeout unless said otherwise.
BARRIER = [
    ("nothing exited: no deadline", [], 10_000.0, None),
    ("before the deadline", [("clean", 100.0, 0)], 159.9, None),
    ("at the deadline: ask every agent", [("clean", 100.0, 0)], 160.0, {A, B}),
    (
        "a second clean exit does not move it",
        [("clean", 100.0, 0), ("clean", 150.0, 1)],
        160.0,
        {A, B},
    ),
    (
        "a step after the exit: counted from the step",
        [("clean", 100.0, 0), ("progress", 130.0)],
        189.9,
        None,
    ),
    ("... and due after that", [("clean", 100.0, 0), ("progress", 130.0)], 190.0, {A, B}),
    (
        "a host whose torchrun exited 0 holds no live rank",
        [("clean", 100.0, 0), ("done", A)],
        160.0,
        {B},
    ),
]


@pytest.mark.parametrize("name, events, now, asked", BARRIER, ids=[c[0] for c in BARRIER])
def test_exit_barrier_deadline(name, events, now, asked):
    w = watch()
    for ev in events:
        if ev[0] == "clean":
            w.on_clean_exit(ev[2], "h", ev[1])
        elif ev[0] == "progress":
            w.on_progress(ev[1])
        else:
            w.on_agent_done(ev[1])
    action = w.poll(now)
    if asked is None:
        assert action is None
    else:
        assert action == AskStacks(Why.EXIT_HANG, frozenset(asked))


def test_exit_hang_carries_the_stacks_of_the_live_ranks_once_every_agent_answered():
    w = watch(exit_s=5.0)
    assert w.on_clean_exit(0, "host-a", 10.0) and not w.on_clean_exit(2, "host-a", 11.0)
    assert w.finishing and w.wakeup() == 15.0
    assert isinstance(w.poll(15.0), AskStacks)
    w.on_stacks(
        A,
        reply(
            {"stacks": {"1": "stack of 1"}, "states": {"1": "sleeping"}, "tails": {"1": ["x"] * 50}}
        ),
    )
    assert w.poll(16.0) is None  # B has not answered yet
    assert w.wakeup() == 25.0  # ... and has until then
    w.on_stacks(
        B, reply({"stacks": {"3": "stack of 3"}, "states": {"3": "disk-sleep"}, "tails": {}})
    )
    hang = w.poll(16.0)
    assert isinstance(hang, ExitHang)
    assert (hang.clean_rank, hang.clean_host, hang.timeout_s, hang.waited_s) == (
        0,
        "host-a",
        5.0,
        5.0,
    )
    assert hang.hung == {1: A, 3: B} and hang.unanswered == frozenset()
    assert hang.stacks == {"1": "stack of 1", "3": "stack of 3"}
    assert hang.states == {"1": "sleeping", "3": "disk-sleep"} and len(hang.tails["1"]) == 20
    assert w.poll(100.0) is None  # reported once


def test_exit_hang_without_an_answer_after_the_stacks_timeout():
    w = watch(exit_s=5.0, stacks_s=10.0)
    w.on_clean_exit(0, "h", 0.0)
    w.poll(5.0)
    w.on_stacks(A, reply({"stacks": {}, "states": {}}))  # A's ranks all exited meanwhile
    w.on_stacks("stranger", reply({"stacks": {"9": "?"}}))  # not asked: ignored
    assert w.poll(14.9) is None
    hang = w.poll(15.0)
    assert isinstance(hang, ExitHang) and hang.unanswered == {B} and hang.hung == {}


def test_a_host_that_finishes_while_asked_is_not_waited_for():
    w = watch(exit_s=5.0)
    w.on_clean_exit(0, "h", 0.0)
    w.poll(5.0)
    w.on_stacks(A, reply({"stacks": {"1": "s"}}))
    w.on_agent_done(B)
    assert isinstance(w.poll(5.1), ExitHang)


# ---- idle guard: every host idle for the window ----------------------------------------------

# Reports are (t, agent, {rank: seconds idle} or None for busy); a 30 s window.
IDLE = [
    ("no report: not idle", [], 1_000.0, False),
    ("one host idle, the other never said", [(100.0, A, {0: 50.0})], 1_000.0, False),
    (
        "both idle, the later one for 29.9 s",
        [(100.0, A, {0: 50.0}), (100.0, B, {1: 20.0})],
        109.9,
        False,
    ),
    (
        "both idle, the later one for 30 s",
        [(100.0, A, {0: 50.0}), (100.0, B, {1: 20.0})],
        110.0,
        True,
    ),
    (
        "the latest rank of a host counts",
        [(100.0, A, {0: 50.0, 1: 5.0}), (100.0, B, {2: 50.0})],
        124.9,
        False,
    ),
    (
        "one host busy again",
        [(100.0, A, {0: 50.0}), (100.0, B, {1: 50.0}), (101.0, B, None)],
        1_000.0,
        False,
    ),
    ("an empty report is not idle", [(100.0, A, {0: 50.0}), (100.0, B, {})], 1_000.0, False),
]


@pytest.mark.parametrize("name, reports, now, fires", IDLE, ids=[c[0] for c in IDLE])
def test_idle_needs_every_host(name, reports, now, fires):
    w = watch(idle_s=30.0)
    for t, agent, ranks in reports:
        w.on_idle(agent, ranks, t)
    action = w.poll(now)
    assert (action == AskStacks(Why.IDLE, frozenset({A, B}))) is fires


def test_idle_hang_names_every_rank_and_how_long_it_was_idle():
    w = watch(idle_s=30.0)
    w.on_idle(A, {0: 40.0, 1: 35.0}, 100.0)
    w.on_idle(B, {2: 31.0}, 101.0)
    assert w.wakeup() == 100.0
    assert isinstance(w.poll(100.0), AskStacks)
    # The dumps are output: the hosts report busy while they answer; the finding stands.
    w.on_idle(A, None, 100.5)
    w.on_stacks(A, reply({"stacks": {"0": "s0", "1": "s1"}}))
    w.on_stacks(B, reply({"stacks": {"2": "s2"}}))
    found = w.poll(101.0)
    assert isinstance(found, Idle)
    assert found.idle_s == pytest.approx(30.0)
    assert found.ranks == pytest.approx({0: 40.0, 1: 35.0, 2: 30.0})
    assert found.rank_agents == {0: A, 1: A, 2: B} and set(found.stacks) == {"0", "1", "2"}


@pytest.mark.parametrize(
    "name, setup",
    [
        ("the guard is off (0)", lambda w: setattr(w, "idle_timeout_s", 0.0)),
        ("a rank exited 0: the exit barrier rules", lambda w: w.on_clean_exit(0, "h", 0.0)),
        ("a host's torchrun exited 0, the other is idle", lambda w: w.on_agent_done(A)),
    ],
)
def test_idle_does_not_fire(name, setup):
    w = watch(idle_s=30.0, exit_s=1e9)
    w.on_idle(A, {0: 100.0}, 100.0)
    w.on_idle(B, {1: 100.0}, 100.0)
    setup(w)
    if name.startswith("a host's"):  # the other host alone: it is all that is left, and idle
        assert isinstance(w.poll(100.0), AskStacks)
        return
    assert w.poll(1_000.0) is None


def test_a_clean_exit_while_idle_stacks_are_collected_cancels_the_idle_hang():
    w = watch(idle_s=30.0, exit_s=5.0)
    w.on_idle(A, {0: 100.0}, 100.0)
    w.on_idle(B, {1: 100.0}, 100.0)
    assert w.poll(100.0) == AskStacks(Why.IDLE, frozenset({A, B}))
    w.on_clean_exit(0, "h", 100.2)
    assert w.poll(101.0) is None and w.wakeup() == pytest.approx(105.2)
    assert w.poll(105.2) == AskStacks(Why.EXIT_HANG, frozenset({A, B}))
