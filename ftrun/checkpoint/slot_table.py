"""Which snapshot slot holds what, which one the persist worker reads, and where the next save goes.

Pure: no I/O, no torch, no threads. The Manager owns the locking and the side effects (slot
manifests, the copy, the worker's pipe) and drives this table, so the rules that keep a snapshot
from being overwritten while it is read live in one place and are tested without processes.

A rank has 2 or 3 slots (3 by default; one the tier has no room for is retired, `retire`, and never
written). Each is in one `SlotPhase`; "pinned" means the persist worker reads it
(or will, once its copy is complete), so no save may write into it.

    phase            event            next phase       when
    EMPTY, HELD      WRITE            COPYING          save(): copy into it, not persisted
    EMPTY, HELD      WRITE_PINNED     COPYING_PINNED   save(): copy into it, then persist it
    COPYING          FILL             HELD             the copy and its manifest are complete
    COPYING_PINNED   FILL             PINNED           ... and the persist command goes out
    COPYING(_PINNED) FAIL             EMPTY            the copy (or its manifest) failed
    HELD             PIN              PINNED           close(): persist the latest snapshot
    PINNED           RELEASE          HELD             worker: "released" (read), or "done"
    PINNED_STALE     RELEASE          EMPTY            the same, for a snapshot a restore dropped
    COPYING_PINNED   WORKER_EXIT      COPYING          the worker died: nobody will read it
    PINNED           WORKER_EXIT      HELD
    PINNED_STALE     WORKER_EXIT      EMPTY
    EMPTY, COPYING, HELD  WORKER_EXIT  (unchanged)
    EMPTY, HELD      LOAD             HELD             restore(): the memory tier holds a snapshot
    EMPTY, HELD      DROP             EMPTY            restore(): none, or one of another timeline
    PINNED           LOAD             PINNED
    PINNED, PINNED_STALE  DROP        PINNED_STALE     dropped, but the worker still reads it

Every other (phase, event) pair raises `InvalidTransition`. Apart from the slots, the table
tracks the rank's one persist (`PersistPhase`):

    IDLE       RESERVE      IN_FLIGHT    save() with persist, or close() pinning the latest
    IN_FLIGHT  DONE         IDLE         worker: "done" (ok or not)
    IN_FLIGHT  CANCEL       IDLE         the copy of the slot reserved for it failed
    any        WORKER_EXIT  WORKER_GONE  the worker's reply pipe closed (final)

and `latest`, the slot with the newest complete snapshot (the memory tier), or None. A save writes
into the slot that is neither latest nor pinned, the empty or oldest one first; when a persist pins
the only other slot, it writes over the latest (the memory tier then falls back to the pinned one
while the copy runs). At most one persist is in flight and at most one slot is pinned. Before a
save, `overwrites()` names the step it would write over: the Manager holds the save back while
another rank of the host has not completed a newer one (host_progress.py).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence


class SlotPhase(enum.Enum):
    EMPTY = "empty"  # no valid snapshot: never written, dropped, or failed
    COPYING = "copying"  # a snapshot copy into it is in progress
    COPYING_PINNED = "copying-pinned"  # ... and the worker persists it once the copy is complete
    HELD = "held"  # a complete snapshot (may be overwritten by a save)
    PINNED = "pinned"  # a complete snapshot the worker is reading
    PINNED_STALE = "pinned-stale"  # the worker is reading it, but a restore dropped it


class PersistPhase(enum.Enum):
    IDLE = "idle"
    IN_FLIGHT = "in-flight"
    WORKER_GONE = "worker-gone"


class Event(enum.Enum):
    WRITE = "write"
    WRITE_PINNED = "write-pinned"
    FILL = "fill"
    FAIL = "fail"
    PIN = "pin"
    RELEASE = "release"
    WORKER_EXIT = "worker-exit"
    LOAD = "load"
    DROP = "drop"
    RESERVE = "reserve"
    DONE = "done"
    CANCEL = "cancel"


S, E = SlotPhase, Event
SLOT_TRANSITIONS: dict[tuple[SlotPhase, Event], SlotPhase] = {
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
P = PersistPhase
PERSIST_TRANSITIONS: dict[tuple[PersistPhase, Event], PersistPhase] = {
    (P.IDLE, E.RESERVE): P.IN_FLIGHT,
    (P.IN_FLIGHT, E.DONE): P.IDLE,
    (P.IN_FLIGHT, E.CANCEL): P.IDLE,
    (P.IDLE, E.WORKER_EXIT): P.WORKER_GONE,
    (P.IN_FLIGHT, E.WORKER_EXIT): P.WORKER_GONE,
    (P.WORKER_GONE, E.WORKER_EXIT): P.WORKER_GONE,
}
del S, E, P

COPYING_PHASES = frozenset({SlotPhase.COPYING, SlotPhase.COPYING_PINNED})
PINNED_PHASES = frozenset({SlotPhase.COPYING_PINNED, SlotPhase.PINNED, SlotPhase.PINNED_STALE})
_WITH_SNAPSHOT = frozenset({SlotPhase.HELD, SlotPhase.PINNED})  # restorable: these have a step


class InvalidTransition(RuntimeError):
    """An event the current phase does not allow: a bug in the caller, not a user error."""


def next_slot_phase(phase: SlotPhase, event: Event) -> SlotPhase:
    try:
        return SLOT_TRANSITIONS[phase, event]
    except KeyError:
        raise InvalidTransition(f"slot: {event.value} is not allowed when {phase.value}") from None


def next_persist_phase(phase: PersistPhase, event: Event) -> PersistPhase:
    try:
        return PERSIST_TRANSITIONS[phase, event]
    except KeyError:
        raise InvalidTransition(
            f"persist: {event.value} is not allowed when {phase.value}"
        ) from None


class SlotTable:
    """The phases of one rank's slots, its latest snapshot and its persist (see the module doc)."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"a slot table needs at least one slot (got {slots})")
        self._phases = [SlotPhase.EMPTY] * slots
        self._steps: list[int | None] = [None] * slots  # the step of a HELD or PINNED snapshot
        self._latest: int | None = None
        self._persist = PersistPhase.IDLE
        self._retired: set[int] = set()  # slots the tier had no room for: never written

    # -- queries -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._phases)

    def phase(self, index: int) -> SlotPhase:
        return self._phases[index]

    def step(self, index: int) -> int | None:
        """The step of the snapshot the slot holds; None unless it is HELD or PINNED."""
        return self._steps[index]

    @property
    def latest(self) -> int | None:
        """The slot with the newest complete snapshot, or None."""
        return self._latest

    @property
    def persist(self) -> PersistPhase:
        return self._persist

    @property
    def persisting(self) -> bool:
        """A persist is in flight (the rank's answer when all ranks agree whether to persist)."""
        return self._persist is PersistPhase.IN_FLIGHT

    @property
    def worker_gone(self) -> bool:
        return self._persist is PersistPhase.WORKER_GONE

    def pinned(self) -> int | None:
        found = [i for i, phase in enumerate(self._phases) if phase in PINNED_PHASES]
        return found[0] if found else None

    # -- events --------------------------------------------------------------------------------

    def start_snapshot(self, *, persist: bool) -> int:
        """save(): choose the slot to copy into and mark it; with `persist`, reserve the persist.

        The slot is neither the latest nor pinned, empty or oldest first; failing that, the latest.
        """
        if persist:
            next_persist_phase(self._persist, Event.RESERVE)  # refuse before changing anything
        index = self._choose()
        if index is None:
            raise InvalidTransition(f"no slot to write: {self._describe()}")
        self._move(index, Event.WRITE_PINNED if persist else Event.WRITE)
        if persist:
            self._persist = PersistPhase.IN_FLIGHT
        if self._latest == index:
            self._latest = None
        return index

    def overwrites(self) -> int | None:
        """The step of the snapshot the next save would write over, when it is older than the
        latest's. None: the save takes an empty slot; or the latest itself (two slots, one
        pinned); or a step not older than the latest's (saves that went back to lower steps)."""
        index, latest = self._choose(), self._latest
        if index is None or latest is None or index == latest:
            return None
        step, newest = self._steps[index], self._steps[latest]
        return step if step is not None and newest is not None and step < newest else None

    def retire(self, index: int) -> bool:
        """The tier has no room for slot `index`: no save writes into it again. Only an empty
        slot can go (False otherwise: it holds a snapshot or is being written), and never the
        last two, which the rules above need."""
        if self._phases[index] is not SlotPhase.EMPTY or index == self._latest:
            return False
        if len(self._phases) - len(self._retired) <= 2:
            return False
        self._retired.add(index)
        return True

    @property
    def usable(self) -> int:
        """How many slots saves write into."""
        return len(self._phases) - len(self._retired)

    def filled(self, index: int, step: int) -> bool:
        """The copy into `index` is complete: it is the latest. True: send its persist now."""
        pinned = self._phases[index] is SlotPhase.COPYING_PINNED
        self._move(index, Event.FILL)
        self._steps[index] = step
        self._latest = index
        return pinned

    def copy_failed(self, index: int) -> None:
        """The copy into `index` (or its manifest) failed: it holds nothing, its persist is off."""
        persist = self._persist
        if self._phases[index] is SlotPhase.COPYING_PINNED:
            persist = next_persist_phase(persist, Event.CANCEL)
        self._move(index, Event.FAIL)
        self._persist = persist

    def pin_latest(self) -> int:
        """close(): reserve the persist of the latest snapshot; returns its slot."""
        index = self._latest
        if index is None:
            raise InvalidTransition("no latest snapshot to persist")
        phase = next_persist_phase(self._persist, Event.RESERVE)
        self._move(index, Event.PIN)
        self._persist = phase
        return index

    def released(self) -> None:
        """The worker has read the pinned slot: a save may write into it again."""
        index = self.pinned()
        if index is None:
            raise InvalidTransition(f"no slot is pinned to release: {self._describe()}")
        if not self.persisting:
            raise InvalidTransition(f"release without a persist in flight: {self._describe()}")
        self._move(index, Event.RELEASE)

    def persist_done(self) -> None:
        """The worker finished the persist (committed, or failed): nothing is pinned any more."""
        phase = next_persist_phase(self._persist, Event.DONE)
        index = self.pinned()
        if index is not None:  # the worker may fail before it has read the slot
            self._move(index, Event.RELEASE)
        self._persist = phase

    def worker_exited(self) -> None:
        """The worker is gone (final): its pin, if any, is off; no persist will start again."""
        for index in range(len(self._phases)):
            self._move(index, Event.WORKER_EXIT)
        self._persist = next_persist_phase(self._persist, Event.WORKER_EXIT)

    def restored(self, steps: Sequence[int | None], *, latest: int | None) -> None:
        """restore(): the memory tier now holds `steps` (None: nothing valid) per slot. `latest`
        is the slot restore() loaded from, if any; otherwise the slot with the newest step."""
        if len(steps) != len(self._phases):
            raise InvalidTransition(
                f"restore reported {len(steps)} slots, the table has {len(self._phases)}"
            )
        if any(phase in COPYING_PHASES for phase in self._phases):
            raise InvalidTransition(f"restore while a snapshot copy runs: {self._describe()}")
        if latest is not None and steps[latest] is None:
            raise InvalidTransition(f"restore loaded slot {latest}, which holds no snapshot")
        phases = [
            next_slot_phase(phase, Event.DROP if step is None else Event.LOAD)
            for phase, step in zip(self._phases, steps, strict=True)
        ]  # all or nothing
        self._phases = phases
        self._steps = [
            step if phase in _WITH_SNAPSHOT else None
            for phase, step in zip(phases, steps, strict=True)
        ]
        held = [i for i, step in enumerate(self._steps) if step is not None]
        self._latest = (
            latest
            if latest is not None
            else max(held, key=lambda i: self._steps[i] or 0, default=None)
        )

    # -- internals -----------------------------------------------------------------------------

    def _move(self, index: int, event: Event) -> None:
        phase = next_slot_phase(self._phases[index], event)
        self._phases[index] = phase
        if phase not in _WITH_SNAPSHOT:
            self._steps[index] = None

    def _choose(self) -> int | None:
        """The slot the next save takes (see start_snapshot), None when there is none."""
        free = [
            i
            for i, phase in enumerate(self._phases)
            if i != self._latest
            and i not in self._retired
            and phase in (SlotPhase.EMPTY, SlotPhase.HELD)
        ]
        return min(free, key=self._age) if free else self._latest

    def _age(self, index: int) -> int:
        """Orders slots for reuse: empty ones first, then the oldest snapshot."""
        step = self._steps[index]
        return -1 if step is None else step

    def _describe(self) -> str:
        phases = ", ".join(f"{i}:{p.value}" for i, p in enumerate(self._phases))
        return f"slots [{phases}], latest {self._latest}, persist {self._persist.value}"
