"""How much of the memory tier a rank uses, and stepping down when it does not fit.

The tier has three levels, each needing less of the tier root (`/dev/shm`) than the one above:

    level     in the tier root                          a restart restores from
    LIVE      the live file + `memory_slots` slots       memory (this step, or the last full copy)
    COPIES    `memory_slots` slots                        memory (the last save)

(`memory_slots` is 3 by default: a third slot the tier has no room for is retired first, with
a warning, and the rank keeps its level with two.)
    STORAGE   nothing (the slots are anonymous memory)    storage

A level is used only once everything it needs is reserved (posix_fallocate: on tmpfs the pages
are really taken): the copy slots first (`reserve`, before the state is adopted or copied), then
the live file (the live snapshot's adoption reserves it, and does not adopt when it cannot). Any
failure to reserve or write for want of space (ENOSPC, EDQUOT, ENOMEM, EIO, EFBIG) at any moment
steps the rank down one level or more, with one warning on the rank's stderr and one datagram to
the agent (`runtime.checkpoint_tier`: journaled by the controller as `checkpoint_tier`, with
the figures), never a failed save: every level still persists to storage, and close() persists
the last step whatever the tier's state.

Stepping down is done on the training thread (save(), the optimizer hook, close()), where no
copy is running: the snapshot thread only records a failed write (`MemoryTier.failed`), and the
Manager acts on it at its next call.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable
from pathlib import Path

from ftrun import runtime
from ftrun.checkpoint import slots, tier_space
from ftrun.checkpoint.config import CheckpointConfig
from ftrun.checkpoint.errors import CheckpointError, UnsafePathError
from ftrun.checkpoint.restore import warn
from ftrun.checkpoint.slot_file import Slot


class Level(enum.IntEnum):
    """What the memory tier holds for this rank; only ever lowered, never raised again."""

    STORAGE = 0
    COPIES = 1
    LIVE = 2

    @property
    def label(self) -> str:
        return {0: "storage only", 1: "copies", 2: "live"}[int(self)]


class Capacity:
    """One rank's level. `on_leave(level, drop_slots)` runs when the rank leaves a level, before
    the tier changes: the Manager gives the live tensors back (below LIVE) and, with
    `drop_slots`, waits for the worker to let go of its slot and has the slot table forget them."""

    def __init__(
        self,
        tier: slots.MemoryTier,
        *,
        root: Path | None,
        copies: int,
        live: bool,
        on_leave: Callable[[Level, bool], None],
        on_retire: Callable[[int], bool] = lambda index: False,
    ) -> None:
        self._tier = tier
        self._root = root
        self._copies = copies
        self._on_leave = on_leave
        self._on_retire = on_retire  # the slot table lets a slot go (SlotTable.retire)
        self.retired: set[int] = set()
        if not tier.persistent:
            self.level = Level.STORAGE
        else:
            self.level = Level.LIVE if live else Level.COPIES
        self.needed = 0  # the state's bytes per slot, as last reserved

    @property
    def live(self) -> bool:
        return self.level is Level.LIVE

    def reserve(self, size: int, *, wait_idle: Callable[[], bool]) -> None:
        """Before a save adopts or copies a state of `size` bytes: every copy slot holds it, or
        the rank steps down to STORAGE (anonymous slots). `wait_idle` waits for the snapshot
        thread, which may be growing the slots in the background."""
        self.needed = max(self.needed, size)
        if all(s.size >= size for s in self._usable()):
            return
        wait_idle()
        try:
            for slot in self._usable():
                try:
                    slot.ensure(size)
                except CheckpointError as exc:
                    if not (tier_space.is_full(exc) and self._retire(slot, exc)):
                        raise
        except CheckpointError as exc:
            if not tier_space.is_full(exc) or all(s.directory is None for s in self._usable()):
                raise  # anonymous memory itself: the host is out of memory
            self.step_down(Level.STORAGE, str(exc), drop_slots=True)
            for slot in self._usable():
                slot.ensure(size)

    def _usable(self) -> list[Slot]:
        return [s for s in self._tier.slots if s.index not in self.retired]

    def _retire(self, slot: Slot, exc: CheckpointError) -> bool:
        """No room for a third copy: keep two, with one warning (a kill during a save that
        overlaps a persist may then go back to the persisted step, not the one before)."""
        if slot.index != len(self._tier.slots) - 1:  # not even two fit: step down
            return False
        if not self._on_retire(slot.index):
            return False
        self.retired.add(slot.index)
        slot.give_back()
        warn(
            f"checkpoint snapshots keep 2 copies, not {len(self._tier.slots)}: {exc}; a rank "
            "killed during a save that overlaps a persist restores the persisted step"
        )
        return True

    def check(self) -> None:
        """A write into the tier failed for want of space since the last call: one level down."""
        failed = self._tier.failed
        if failed is not None and self.level is not Level.STORAGE:
            self._tier.failed = None
            self.step_down(
                Level(self.level - 1), f"a snapshot could not be written to the tier: {failed}"
            )

    def absorb(self, error: BaseException, what: str) -> bool:
        """A snapshot failed with `error`: True if it was the tier running out (the rank then
        stepped down and goes on; the save is lost, the next one is made at the new level)."""
        if not tier_space.is_full(error) or self.level is Level.STORAGE:
            return False
        self.step_down(Level(self.level - 1), f"{what} failed: {error}")
        return True

    def rescue(self, slot: Slot, size: int, exc: CheckpointError) -> None:
        """close(): the copy of the last live step into `slot` found no room in the tier; the
        slot goes anonymous, so that the step is persisted all the same."""
        if not tier_space.is_full(exc) or slot.directory is None:
            raise exc
        warn(f"the last step is persisted from anonymous memory: {exc}")
        slot.go_anonymous()
        slot.ensure(size)

    def step_down(self, level: Level, why: str, *, drop_slots: bool = False) -> None:
        """Leave the current level for `level` (lower): one warning, one event. `drop_slots`:
        the copy slots leave the tier root too (they could not be reserved there)."""
        if level >= self.level:
            if drop_slots:
                self._on_leave(level, True)
                self._tier.drop_slots()
            return
        before, self.level = self.level, level
        self._on_leave(level, drop_slots)
        if self._tier.live is not None:  # below LIVE: the live file's space goes back
            self._tier.live.go_anonymous()
        if level is Level.STORAGE:
            self._tier.leave()
            if drop_slots:
                self._tier.drop_slots()
        self._tier.failed = None
        figures = self.figures()
        warn(
            f"the memory tier steps down from {before.label} to {level.label}: {why}"
            + (f" (needs {figures['text']})" if figures else "")
            + (
                "; a restart restores from storage"
                if level is Level.STORAGE
                else "; saves copy the state into the slots"
            )
        )
        runtime.checkpoint_tier(
            level.name.lower(),
            before.name.lower(),
            why,
            need=int(figures.get("need", 0)),
            free=int(figures.get("free", -1)),
            total=int(figures.get("total", -1)),
        )

    def figures(self) -> dict[str, int | str]:
        """What the tier needs at each level against what its root has."""
        if not self.needed or self._root is None:
            return {}
        copies = self._copies * self.needed
        out: dict[str, int | str] = {"need": copies + self.needed}
        text = (
            f"{tier_space.mib(copies + self.needed)} for live + {self._copies} slots, "
            f"{tier_space.mib(copies)} for the slots alone"
        )
        try:
            st = os.statvfs(self._root)
        except OSError:
            out["text"] = text
            return out
        out["free"], out["total"] = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
        out["text"] = (
            f"{text}; {self._root} has {tier_space.mib(int(out['free']))} free of "
            f"{tier_space.mib(int(out['total']))}"
        )
        return out


def open_tier(config: CheckpointConfig, *, rank: int, world: int) -> slots.MemoryTier:
    """This rank's memory tier; without one (anonymous slots, STORAGE) when the job has no tier,
    or when its directory is refused (not ours alone: the message names it and why) or cannot
    be made (a full tier root). A refused tier never fails the job: it says why, once."""
    mem = config.memory_dir
    if mem is not None:
        try:
            return slots.MemoryTier(
                directory=mem / f"rank{rank}",
                slots=config.memory_slots,
                rank=rank,
                world_size=world,
                key=config.hmac_key,
            )
        except UnsafePathError as exc:
            refused(config, f"{exc.message} ({exc.hint})")
        except (CheckpointError, OSError) as exc:
            if not tier_space.is_full(exc):
                raise
            refused(config, f"{exc} ({tier_space.space(config.memory_root)})")
    return slots.MemoryTier(
        directory=None, slots=config.memory_slots, rank=rank, world_size=world, key=config.hmac_key
    )


def refused(config: CheckpointConfig, why: str) -> None:
    """The job's memory tier is not used on this rank (STORAGE from the start): say why."""
    level = Level.LIVE if config.live_snapshot else Level.COPIES
    warn(f"the memory tier is not used, checkpoints go to storage only: {why}")
    runtime.checkpoint_tier("storage", level.name.lower(), why, need=0, free=-1, total=-1)


def leave_tier(
    tier: slots.MemoryTier, config: CheckpointConfig, exc: OSError, *, world: int
) -> slots.MemoryTier:
    """The tier was made but its first write (the generation fence's file) found no room:
    close it and go on without (STORAGE), saying why; anything else is raised again."""
    if not tier_space.is_full(exc):
        raise exc
    tier.close()
    refused(config, f"{exc} ({tier_space.space(config.memory_root)})")
    return slots.MemoryTier(
        directory=None,
        slots=config.memory_slots,
        rank=tier.rank,
        world_size=world,
        key=config.hmac_key,
    )
