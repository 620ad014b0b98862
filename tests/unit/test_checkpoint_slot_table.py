"""The checkpoint slot state machine (ftrun/checkpoint/slot_table.py), without processes or torch.

Every (phase, event) pair: the transitions written down below succeed, every other one raises.
Then the table as the Manager drives it: where a save goes, what a persist pins, what the
worker's replies release, what a restore keeps."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from ftrun.checkpoint.slot_table import (
    Event,
    InvalidTransition,
    PersistPhase,
    SlotPhase,
    SlotTable,
    next_persist_phase,
    next_slot_phase,
)

S, E, P = SlotPhase, Event, PersistPhase

# Written out again on purpose: a change to the module's table must be a change here too.
SLOT = {
    (S.EMPTY, E.WRITE): S.COPYING,
    (S.HELD, E.WRITE): S.COPYING,
    (S.EMPTY, E.WRITE_PINNED): S.COPYING_PINNED,
    (S.HELD, E.WRITE_PINNED): S.COPYING_PINNED,
    (S.COPYING, E.FILL): S.HELD,
    (S.COPYING_PINNED, E.FILL): S.PINNED,
    (S.COPYING, E.FAIL): S.EMPTY,
    (S.COPYING_PINNED, E.FAIL): S.EMPTY,
    (S.HELD, E.PIN): S.PINNED,
    (S.PINNED, E.RELEASE): S.HELD,
    (S.PINNED_STALE, E.RELEASE): S.EMPTY,
    (S.EMPTY, E.WORKER_EXIT): S.EMPTY,
    (S.COPYING, E.WORKER_EXIT): S.COPYING,
    (S.COPYING_PINNED, E.WORKER_EXIT): S.COPYING,
    (S.HELD, E.WORKER_EXIT): S.HELD,
    (S.PINNED, E.WORKER_EXIT): S.HELD,
    (S.PINNED_STALE, E.WORKER_EXIT): S.EMPTY,
    (S.EMPTY, E.LOAD): S.HELD,
    (S.HELD, E.LOAD): S.HELD,
    (S.PINNED, E.LOAD): S.PINNED,
    (S.EMPTY, E.DROP): S.EMPTY,
    (S.HELD, E.DROP): S.EMPTY,
    (S.PINNED, E.DROP): S.PINNED_STALE,
    (S.PINNED_STALE, E.DROP): S.PINNED_STALE,
}
PERSIST = {
    (P.IDLE, E.RESERVE): P.IN_FLIGHT,
    (P.IN_FLIGHT, E.DONE): P.IDLE,
    (P.IN_FLIGHT, E.CANCEL): P.IDLE,
    (P.IDLE, E.WORKER_EXIT): P.WORKER_GONE,
    (P.IN_FLIGHT, E.WORKER_EXIT): P.WORKER_GONE,
    (P.WORKER_GONE, E.WORKER_EXIT): P.WORKER_GONE,
}


@pytest.mark.parametrize(
    ("phase", "event"), list(itertools.product(SlotPhase, Event)), ids=lambda v: v.value
)
def test_every_slot_transition_is_written_down_or_refused(phase, event):
    if (phase, event) in SLOT:
        assert next_slot_phase(phase, event) is SLOT[phase, event]
    else:
        with pytest.raises(
            InvalidTransition, match=f"{event.value} is not allowed when {phase.value}"
        ):
            next_slot_phase(phase, event)


@pytest.mark.parametrize(
    ("phase", "event"), list(itertools.product(PersistPhase, Event)), ids=lambda v: v.value
)
def test_every_persist_transition_is_written_down_or_refused(phase, event):
    if (phase, event) in PERSIST:
        assert next_persist_phase(phase, event) is PERSIST[phase, event]
    else:
        with pytest.raises(InvalidTransition):
            next_persist_phase(phase, event)


# -- the table as the Manager drives it ---------------------------------------------------------


def phases(table: SlotTable) -> list[SlotPhase]:
    return [table.phase(i) for i in range(len(table))]


def check_invariants(table: SlotTable) -> None:
    pinned = [
        i for i, p in enumerate(phases(table)) if p in (S.COPYING_PINNED, S.PINNED, S.PINNED_STALE)
    ]
    assert len(pinned) <= 1
    if pinned:
        assert table.persisting
    if table.latest is not None:
        assert table.phase(table.latest) in (S.HELD, S.PINNED)
        assert table.step(table.latest) is not None


def saved(table: SlotTable, step: int, *, persist: bool = False) -> int:
    """A save whose copy completes: returns the slot."""
    index = table.start_snapshot(persist=persist)
    assert table.filled(index, step) is persist
    return index


def test_a_persisted_save_pins_its_slot_until_the_worker_has_read_it():
    table = SlotTable(2)
    index = table.start_snapshot(persist=True)
    assert (index, phases(table), table.persist) == (0, [S.COPYING_PINNED, S.EMPTY], P.IN_FLIGHT)
    assert table.latest is None
    assert table.filled(0, 1) is True  # send the persist command now
    assert (phases(table), table.latest, table.step(0)) == ([S.PINNED, S.EMPTY], 0, 1)
    table.released()
    assert (phases(table), table.persist) == ([S.HELD, S.EMPTY], P.IN_FLIGHT)
    table.persist_done()
    assert (phases(table), table.persist, table.latest) == ([S.HELD, S.EMPTY], P.IDLE, 0)


def test_saves_go_to_the_empty_or_oldest_slot_never_the_latest():
    table = SlotTable(3)
    assert [saved(table, step) for step in range(1, 6)] == [0, 1, 2, 0, 1]
    assert (table.latest, [table.step(i) for i in range(3)]) == (1, [4, 5, 3])


def test_with_the_other_slot_pinned_a_save_writes_over_the_latest():
    table = SlotTable(2)
    saved(table, 1, persist=True)  # slot 0, pinned: the worker is still reading it
    assert saved(table, 2) == 1
    assert table.start_snapshot(persist=False) == 1  # over the latest: memory falls back to 0
    assert (phases(table), table.latest) == ([S.PINNED, S.COPYING], None)
    check_invariants(table)


def test_with_three_slots_a_save_beside_a_persist_never_writes_over_the_latest():
    """Three slots (the default): a kill during any copy finds the step before it (issue 33:
    with two, a save beside a persist wrote over the latest and the tier fell back to the
    persisted step, up to three saves old)."""
    table = SlotTable(3)
    saved(table, 1, persist=True)  # slot 0: the worker reads it for a while
    for step in range(2, 8):
        index = table.start_snapshot(persist=False)
        assert index != table.latest and table.latest is not None  # step - 1 stays whole
        assert table.step(table.latest) == step - 1
        table.filled(index, step)
        check_invariants(table)


def test_overwrites_names_the_step_a_save_would_write_over_unless_it_is_the_latest():
    """What the Manager checks against the host's other ranks before a save (host_progress.py);
    asking changes nothing."""
    table = SlotTable(3)
    assert table.overwrites() is None  # an empty slot first
    for step in (1, 2, 3):
        saved(table, step)
    before = (phases(table), table.latest)
    assert table.overwrites() == 1
    assert (phases(table), table.latest) == before
    assert table.start_snapshot(persist=False) == 0  # the slot that held 1
    pinned = SlotTable(3)
    saved(pinned, 1, persist=True)  # the worker reads slot 0 for a while
    for step in (2, 3):
        saved(pinned, step)
    assert pinned.overwrites() == 2  # the only slot neither latest nor pinned
    two = SlotTable(2)
    saved(two, 1, persist=True)
    saved(two, 2)
    assert two.overwrites() is None  # the latest: two slots beside a persist give up the bound
    assert two.start_snapshot(persist=False) == 1
    back = SlotTable(3)
    for step in (4, 5, 6, 1):  # saves that went back to step 1 (over the slot of 4)
        saved(back, step)
    assert back.overwrites() is None  # the slot of 5: not older than the latest, 1


def test_a_retired_slot_is_never_written_and_two_always_stay():
    table = SlotTable(3)
    assert table.retire(2) is True and table.usable == 2
    assert [saved(table, step) for step in range(1, 5)] == [0, 1, 0, 1]
    assert table.retire(1) is False  # it holds a snapshot, and two must stay
    assert table.retire(0) is False and table.usable == 2
    held = SlotTable(3)
    saved(held, 1)
    assert held.retire(0) is False  # the latest snapshot is not given up
    copying = SlotTable(3)
    copying.start_snapshot(persist=False)
    assert copying.retire(0) is False and copying.usable == 3


def test_a_failed_copy_leaves_its_slot_empty_and_cancels_its_persist():
    table = SlotTable(2)
    saved(table, 1)
    index = table.start_snapshot(persist=True)
    table.copy_failed(index)
    assert (phases(table), table.persist, table.latest) == ([S.HELD, S.EMPTY], P.IDLE, 0)
    index = table.start_snapshot(persist=False)
    table.copy_failed(index)
    assert (phases(table), table.persist) == ([S.HELD, S.EMPTY], P.IDLE)


def test_a_worker_that_fails_before_reading_still_unpins():
    table = SlotTable(2)
    saved(table, 1, persist=True)
    table.persist_done()  # "done" with ok=False, no "released" before it
    assert (phases(table), table.persist) == ([S.HELD, S.EMPTY], P.IDLE)


def test_a_dead_worker_unpins_everything_and_refuses_new_persists():
    table = SlotTable(2)
    saved(table, 1, persist=True)
    table.worker_exited()
    assert (phases(table), table.persist, table.worker_gone) == (
        [S.HELD, S.EMPTY],
        P.WORKER_GONE,
        True,
    )
    with pytest.raises(InvalidTransition):
        table.start_snapshot(persist=True)
    with pytest.raises(InvalidTransition):
        table.pin_latest()
    assert saved(table, 2) == 1  # the memory tier goes on


def test_a_worker_dying_during_a_pinned_copy_means_nothing_to_send():
    table = SlotTable(2)
    index = table.start_snapshot(persist=True)
    table.worker_exited()
    assert table.phase(index) is S.COPYING
    assert table.filled(index, 1) is False
    assert (phases(table), table.latest) == ([S.HELD, S.EMPTY], 0)


def test_close_pins_the_latest_snapshot():
    table = SlotTable(2)
    saved(table, 1)
    saved(table, 2)
    assert table.pin_latest() == 1
    assert (phases(table), table.persist) == ([S.HELD, S.PINNED], P.IN_FLIGHT)
    table.released()
    table.persist_done()
    assert (phases(table), table.persist) == ([S.HELD, S.HELD], P.IDLE)


def test_restore_keeps_what_the_memory_tier_holds_and_picks_the_latest():
    table = SlotTable(3)
    table.restored([7, None, 9], latest=None)
    assert (phases(table), table.latest) == ([S.HELD, S.EMPTY, S.HELD], 2)
    table.restored([7, None, None], latest=0)  # restored step 7 from slot 0: slot 2 was newer
    assert (phases(table), table.latest, table.step(2)) == ([S.HELD, S.EMPTY, S.EMPTY], 0, None)
    table.restored([None, None, None], latest=None)  # restored from storage, nothing in memory
    assert (phases(table), table.latest) == ([S.EMPTY] * 3, None)


def test_a_restore_that_drops_a_pinned_snapshot_frees_it_only_once_read():
    table = SlotTable(2)
    saved(table, 5, persist=True)
    table.restored([None, None], latest=None)  # restored an older step from storage
    assert (phases(table), table.latest, table.persist) == (
        [S.PINNED_STALE, S.EMPTY],
        None,
        P.IN_FLIGHT,
    )
    assert table.start_snapshot(persist=False) == 1  # never into the slot the worker reads
    table.filled(1, 3)
    table.released()
    assert (phases(table), table.latest) == ([S.EMPTY, S.HELD], 1)
    table.persist_done()
    assert table.persist is P.IDLE


def _fresh() -> SlotTable:
    return SlotTable(2)


def _copying() -> SlotTable:
    table = SlotTable(2)
    table.start_snapshot(persist=False)
    return table


def _persisting() -> SlotTable:
    table = SlotTable(2)
    saved(table, 1, persist=True)
    return table


@pytest.mark.parametrize(
    ("make", "call", "match"),
    [
        (_fresh, lambda t: t.filled(0, 1), "fill is not allowed when empty"),
        (_fresh, lambda t: t.copy_failed(0), "fail is not allowed when empty"),
        (_fresh, lambda t: t.released(), "no slot is pinned"),
        (_fresh, lambda t: t.persist_done(), "done is not allowed when idle"),
        (_fresh, lambda t: t.pin_latest(), "no latest snapshot"),
        (_fresh, lambda t: t.restored([1], latest=None), "restore reported 1 slots"),
        (_fresh, lambda t: t.restored([None, 3], latest=0), "slot 0, which holds no snapshot"),
        (_copying, lambda t: t.filled(1, 1), "fill is not allowed when empty"),
        (_copying, lambda t: t.restored([None, None], latest=None), "while a snapshot copy runs"),
        (
            _persisting,
            lambda t: t.start_snapshot(persist=True),
            "reserve is not allowed when in-flight",
        ),
        (_persisting, lambda t: t.pin_latest(), "reserve is not allowed when in-flight"),
        (_persisting, lambda t: t.filled(0, 2), "fill is not allowed when pinned"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_invalid_calls_raise_and_change_nothing(
    make: Callable[[], SlotTable], call: Callable[[SlotTable], object], match: str
):
    table = make()
    before = (phases(table), table.latest, table.persist)
    with pytest.raises(InvalidTransition, match=match):
        call(table)
    assert (phases(table), table.latest, table.persist) == before


def test_a_save_never_writes_into_a_slot_being_copied_or_read():
    table = SlotTable(1)  # Manager configs have 2 or 3 slots; one makes the corner reachable
    table.start_snapshot(persist=False)
    with pytest.raises(InvalidTransition, match="no slot to write"):
        table.start_snapshot(persist=False)
    table.filled(0, 1)
    table.pin_latest()  # the only slot is the latest and the worker reads it
    with pytest.raises(InvalidTransition, match="write is not allowed when pinned"):
        table.start_snapshot(persist=False)
    table.released()
    assert table.start_snapshot(persist=False) == 0  # the latest, once the worker has read it
