"""The Manager's live-snapshot path: the saves that copy next to nothing (live.py).

`live.py` is the live snapshot itself: the state's tensors moved into the memory tier's live
file, and the guard that watches them. This module is the Manager's side of it, for the saves
that use it: whether the state is adopted at a save (again when its layout or its tensors
changed), the save that commits the live file's manifest before it returns, the guard's check
where the state may change from, the step the tier down gives the tensors back at, and how
many saves apart the full copies into a slot are (the fallback of a rank killed inside an
optimizer step), from what the last one cost against the time between saves.

A save takes this path when the state is adopted, the snapshot is not disabled, the save is not
persisted and no full copy is due (manager.py decides); the others take the copy path
(copy_path.py).
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from ftrun.checkpoint import capacity, live
from ftrun.checkpoint.config import CheckpointConfig
from ftrun.checkpoint.errors import CheckpointError
from ftrun.checkpoint.generation_claim import GenerationClaim
from ftrun.checkpoint.guard import Guard
from ftrun.checkpoint.persister import Persister
from ftrun.checkpoint.restore import warn
from ftrun.checkpoint.slot_file import Slot
from ftrun.checkpoint.slot_layout import SlotLayout
from ftrun.checkpoint.slots import MemoryTier
from ftrun.checkpoint.snapshot_meta import SnapshotMeta
from ftrun.checkpoint.state import TrainState
from ftrun.checkpoint.tier_space import is_full

Commit = Callable[[int, SnapshotMeta], None]  # write a slot's manifest (the Manager's _commit)


class LivePath:
    """The state adopted into the live file, for one Manager."""

    def __init__(
        self,
        config: CheckpointConfig,
        *,
        tier: MemoryTier,
        capacity: capacity.Capacity,
        claim: GenerationClaim,
        guard: Guard,
        persister: Persister,
        commit: Commit,
    ) -> None:
        self._config = config
        self._tier, self._capacity, self._claim = tier, capacity, claim
        self._guard, self._persister, self._commit = guard, persister, commit
        self.snapshot: live.LiveSnapshot | None = None  # the state adopted into the tier
        self._refused: str | None = None  # the layout whose adoption found nothing to move
        self._saved_at: float | None = None  # the last save (time.perf_counter())
        # The last times between saves: their median is the time per save a full copy is
        # weighed against (a pause for an evaluation does not count).
        self._save_gaps: collections.deque[float] = collections.deque(maxlen=9)

    @property
    def active(self) -> bool:
        """Whether a save may commit the live file instead of copying into a slot."""
        return self.snapshot is not None and self.snapshot.disabled is None

    def time_save(self, t0: float) -> None:
        """A save starts at `t0` (time.perf_counter()): the time between saves, for full copies."""
        if self._saved_at is not None:
            self._save_gaps.append(t0 - self._saved_at)
        self._saved_at = t0

    def let_go(self, *, check: bool = True) -> None:
        """The state may change from here: the live file holds no snapshot any more. `check`:
        first the guard looks for a change since the commit (live.py) and turns the live
        snapshot off if it finds one; restore() skips it, since loading is what changes them."""
        snap = self.snapshot
        if snap is not None and (not check or snap.check()):
            snap.retract()

    def adopt(self, flat: Any, keyed: list[tuple[str, torch.Tensor]], layout: SlotLayout) -> bool:
        """Move the state into the live slot (live.py) when it is not there for this layout;
        True if it moved now. Off without the memory tier (the caller leaves GPU state out)."""
        if not self._config.live_snapshot or self._tier.live is None or not self._capacity.live:
            return False
        current = self.snapshot
        if current is not None and (
            current.disabled is not None
            or (current.sig == layout.sig and current.holds(keyed, layout.entries))
        ):
            return False
        if self._refused == layout.sig:
            return False
        previous, self.snapshot = current, None
        if previous is not None:  # the layout or the tensors changed: into a fresh file
            previous.retract()
            previous.unhook()  # its forward pre-hooks (live.py) go with it
        self._claim.acquire()  # a zombie must not replace the live file
        try:
            roots = [obj for obj, _ in flat.roots if isinstance(obj, TrainState)]
            self.snapshot = live.LiveSnapshot.adopt(self._tier, keyed, layout, roots, previous)
        except CheckpointError as exc:  # e.g. /dev/shm too small for one more copy
            self.snapshot = None
            if is_full(exc):
                self._capacity.step_down(capacity.Level.COPIES, str(exc))
            else:
                warn(f"the live snapshot is off, every save copies the state: {exc}")
        finally:
            self._claim.release()
        if self.snapshot is None:
            self._refused = layout.sig
            return False
        self.snapshot.on_change = partial(self._guard.trip, before="live")
        return True

    def save(self, meta: SnapshotMeta, keyed: list[tuple[str, torch.Tensor]]) -> None:
        """Holding the tier's claim (released here): commit the live snapshot of `meta.step`
        before returning, so a rank that dies at any moment after save() restores this step
        (~1.5 ms for 768 tensors here). What the file does not keep live (buffers, a
        channels_last or shared tensor, an EMA module) is copied in first, here: a copy left to
        the background thread may not be done before the next optimizer step takes the snapshot
        back (issue 33)."""
        snap = self.snapshot
        try:
            assert snap is not None
            for (_, t), e in zip(keyed, meta.layout.entries, strict=True):
                if e.key not in snap.keys:
                    snap.slot.view(e).copy_(t)
            self._commit(self._tier.live_index, meta)
            snap.committed_as(meta)
        except OSError as exc:  # the commit's files (a full /dev/shm)
            raise CheckpointError(
                f"the live snapshot of step {meta.step} could not be written: {exc}",
                hint="is /dev/shm full? see docs/checkpoint.md, Memory bound",
            ) from exc
        finally:
            self._claim.release()

    def full_copy_took(self, held_s: float) -> None:
        """A full copy into a slot held the optimizer step up `held_s` seconds: that decides how
        far apart the next are (save() itself costs the same whether it copies or not)."""
        if self.snapshot is not None and self._config.full_copy_every is None:
            gap = statistics.median(self._save_gaps) if self._save_gaps else 0.0
            self._persister.proposed_full_copy_every = live.full_copy_every(held_s, gap)

    def copy_out(self, copy: Callable[[SnapshotMeta, Slot], None]) -> None:
        """close(): the last save may be held by the live slot alone, which the persist worker
        does not read and which the state changes under once the hook is gone (training may go
        on after close). `copy` puts it into a slot (copy_path.py), the snapshot of that step
        from now on."""
        snap = self.snapshot
        if snap is None or not snap.check() or not snap.committed or snap.last is None:
            return
        copy(snap.last, snap.slot)
        snap.retract()

    def leave(self) -> None:
        """The tier steps down below LIVE (capacity.py): the tensors go back to the heap."""
        if self.snapshot is not None:
            self._tier.invalidate(self._tier.live_index)
            self.snapshot.give_back()
            self.snapshot = None

    def close(self) -> None:
        if self.snapshot is not None:
            self.snapshot.give_back()
            self.snapshot = None
