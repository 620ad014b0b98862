"""The host-memory tier: this rank's snapshot buffers (slots) and their manifests.

With a job id the tier is `/dev/shm/ftrun-<uid>/<job>/rank<R>/`: each slot a file there
(slot_file.py) with a manifest beside it (memory_manifest.py), so the snapshots outlive the rank
process and a restart in place restores from them; tmpfs survives the rank process but not the
host. Without one the slots are anonymous and nothing is kept.

Memory bound: `memory_slots` (3 by default, 2 where the tier has no room for 3) x this rank's
state bytes, allocated up front. Running out is never fatal (capacity.py): a slot that cannot be
reserved in the tier becomes anonymous memory (still a buffer for the persist), and a manifest
that cannot be written is left unwritten and recorded in `MemoryTier.failed` for the Manager to
step the tier down.

/dev/shm is writable by every user and the tier's name is easy to guess, so the tier trusts only
what this user made: every job's tier is under one per-user parent, `/dev/shm/ftrun-<uid>/`, made
0700 (no other user can reach into it, so nothing can be planted under it); the parent,
`<job>/` and `rank<R>/` are refused, with a clear error, when they already exist owned by another
uid, open to group or others, or as a link (the Manager then goes on without the tier and says
why); the slot files are refused unless they are regular files of ours with mode 0600
(slot_file.py); every manifest carries an HMAC and the objects are a sealed pickle (auth.py), so
a snapshot that does not verify is skipped with a warning and restore falls back to storage.

The slot layout's names and the host-wide scan are importable from here too (`slots.layout`,
`slots.scan_host`…), where the tests look for them.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ftrun import private
from ftrun.checkpoint import auth, host_progress, storage
from ftrun.checkpoint.config import memory_user_dir_name
from ftrun.checkpoint.errors import UnsafePathError
from ftrun.checkpoint.host_snapshots import HostSnapshot, scan_host
from ftrun.checkpoint.memory_manifest import (
    manifest_entries,
    read_manifest,
    verified_objects,
    write_manifest,
)
from ftrun.checkpoint.slot_file import TIER_HINT, Slot
from ftrun.checkpoint.slot_layout import ALIGN, TensorEntry, entry_view, layout, signature
from ftrun.checkpoint.tier_space import is_full

__all__ = [  # defined here, and the names of its parts that tests import from here
    "ALIGN",
    "HostSnapshot",
    "MemoryTier",
    "SlotState",
    "TensorEntry",
    "ensure_tier_dirs",
    "entry_view",
    "layout",
    "scan_host",
    "signature",
]


def ensure_tier_dirs(directory: Path) -> None:
    """Make this user's private parent (`ftrun-<uid>`, 0700), the job's tier directory in it and
    this rank's (0700), refusing any that is not ours alone, and a root where others could swap
    them (group/other-writable without the sticky bit; /dev/shm has it)."""
    user = next((p for p in directory.parents if p.name == memory_user_dir_name()), None)
    root = user.parent if user is not None else directory.parent.parent
    try:
        st = os.stat(root)  # the root itself may be a link (/dev/shm -> /run/shm)
    except FileNotFoundError:
        pass  # made 0700 below
    else:
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise UnsafePathError(
                f"the checkpoint memory root {root} is not safe to use: other users can rename "
                f"what is in it ({private.describe(st)})",
                hint="pass ftrun.checkpoint.Manager(memory_root=...) a directory only you can "
                "write, or one with the sticky bit like /dev/shm",
            )
    for path in ([user] if user is not None else []) + [directory.parent, directory]:
        private.ensure_dir(
            path,
            forbid=private.GROUP_OTHER_ANY,
            what="checkpoint memory tier",
            hint=TIER_HINT,
            error=UnsafePathError,
        )


@dataclass
class SlotState:
    """What a slot holds, as far as this process knows."""

    step: int | None = None  # None: invalid (being written, or never written)
    generation: int = 0
    entries: list[TensorEntry] = field(default_factory=list)
    objects: bytes = b""


class MemoryTier:
    """This rank's slots, and their manifests when the tier outlives the process.

    `slots` are the copies' buffers (the slot table's, `slot_table.py`); when the tier outlives
    the process it also has `live`, the file the live snapshot keeps the training state in
    (live.py). Where a slot is named by index, `len(slots)` is the live one (`live_index`)."""

    def __init__(
        self, *, directory: Path | None, slots: int, rank: int, world_size: int, key: bytes
    ) -> None:
        self.directory = directory
        self.rank, self.world_size = rank, world_size
        self._key = key
        if directory is not None:
            ensure_tier_dirs(directory)
        self.slots = [Slot(i, directory) for i in range(slots)]
        self.live = Slot(slots, directory, name="live") if directory is not None else None
        self.states = [SlotState() for _ in range(slots + 1)]
        # The first write into the tier that failed for want of space (a manifest, an objects
        # file); the Manager reads it and steps the tier down (capacity.py).
        self.failed: OSError | None = None
        self.kept = directory is not None  # snapshots are kept in the tier (False: leave())
        # The Manager's nonce: this rank's record of its newest step, which the host's other
        # ranks read before they write over a snapshot, is this run's (host_progress.py).
        self.run: str | None = None

    def leave(self) -> None:
        """Stop keeping snapshots in the tier: every manifest is removed and none is written
        again (a restart restores from storage). The slots stay buffers for the persist: their
        files keep their (reserved) space, or are anonymous memory (`drop_slots`)."""
        self.kept = False
        host_progress.withdraw(self.directory)  # no rank waits for these slots any more
        for slot in self._all():
            path = slot.manifest_path
            if path is not None:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass

    def drop_slots(self) -> None:
        """Every copy slot becomes anonymous memory (its snapshot is lost: the caller has the
        slot table forget them), giving its space in the tier back."""
        host_progress.withdraw(self.directory)
        for slot in self.slots:
            self.states[slot.index] = SlotState()
            slot.go_anonymous()

    @property
    def persistent(self) -> bool:
        return self.directory is not None

    @property
    def live_index(self) -> int:
        return len(self.slots)

    def _all(self) -> list[Slot]:
        return self.slots + ([self.live] if self.live is not None else [])

    def slot(self, index: int) -> Slot:
        if index == self.live_index:
            assert self.live is not None
            return self.live
        return self.slots[index]

    def scan(self, sig: str) -> tuple[list[int], list[str]]:
        """Load manifests of valid snapshots that match layout `sig`: returns their slot indexes,
        and why each snapshot there that does not verify was skipped (the caller warns). A slot
        without a manifest, or with another layout's (a resharded restart), is skipped quietly."""
        found, skipped = [], []
        for slot in self._all():
            state = self.states[slot.index]
            if slot.manifest_path is None or slot.objects_path is None:
                continue
            if not os.path.lexists(slot.manifest_path):
                continue  # never written, or invalidated: nothing to say
            try:
                body = read_manifest(slot.manifest_path, key=self._key)
                if (body["rank"], body["world_size"], body["signature"]) != (
                    self.rank,
                    self.world_size,
                    sig,
                ):
                    continue  # another layout: not this restore's, nothing wrong with it
                objects = verified_objects(
                    body, slot.objects_path, os.fstat(slot.fd).st_size, self._key
                )
            except (storage.Invalid, auth.NotAuthentic, OSError, KeyError) as exc:
                skipped.append(f"memory snapshot {slot.manifest_path} is not loaded: {exc}")
                continue
            state.step, state.generation = body["step"], body["generation"]
            state.entries = manifest_entries(body)
            state.objects = objects
            slot.remap()
            found.append(slot.index)
        return found, skipped

    def keep_until(self, step: int) -> list[int | None]:
        """Drop invalid slots' leftovers and the snapshots newer than `step` (another timeline);
        returns each copy slot's step (not the live one's)."""
        for slot in self._all():
            state = self.states[slot.index]
            if state.step is None or state.step > step:
                self.invalidate(slot.index)
        return [state.step for state in self.states[: self.live_index]]

    def invalidate_all(self) -> None:
        """Stale snapshots of an earlier process (a save without a restore) must not be restored."""
        for slot in self._all():
            self.invalidate(slot.index)

    def invalidate(self, index: int) -> None:
        self.states[index] = SlotState()
        path = self.slot(index).manifest_path
        if path is not None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def commit(
        self,
        index: int,
        *,
        step: int,
        generation: int,
        sig: str,
        entries: list[TensorEntry],
        objects: bytes,
        data_size: int,
    ) -> None:
        """Write the manifest of the snapshot in slot `index`; once it is in the tier, this
        rank's record says it has completed `step` (live saves too: see host_progress.py)."""
        slot = self.slot(index)
        kept = self.kept and slot.manifest_path is not None and slot.objects_path is not None
        try:
            self._write_manifest(slot, step, generation, sig, entries, objects, data_size)
        except OSError as exc:
            kept = False
            if not is_full(exc):
                raise
            # The tier is full (another user's files, a filler): this snapshot is not in memory,
            # but the copy is in the slot, and the persist goes on from it. The Manager steps
            # the tier down at its next save (capacity.py).
            self.failed = self.failed or exc
            for path in (slot.manifest_path, slot.objects_path):
                for leftover in (path, path and path.with_name(path.name + ".tmp")):
                    if leftover is not None:
                        try:
                            os.unlink(leftover)
                        except OSError:
                            pass
        self.states[index] = SlotState(step, generation, entries, objects)
        if kept:
            self.record(step)

    def record(self, step: int) -> None:
        """This rank has completed (or restored) `step`: the host's other ranks may write over
        their older snapshots as far as it goes (host_progress.py)."""
        if self.kept and self.run is not None:
            host_progress.publish(self.directory, run=self.run, step=step)

    def _write_manifest(
        self,
        slot: Slot,
        step: int,
        generation: int,
        sig: str,
        entries: list[TensorEntry],
        objects: bytes,
        data_size: int,
    ) -> None:
        if self.kept and slot.manifest_path is not None and slot.objects_path is not None:
            write_manifest(
                slot.manifest_path,
                slot.objects_path,
                data=slot.base,
                step=step,
                generation=generation,
                rank=self.rank,
                world_size=self.world_size,
                sig=sig,
                entries=entries,
                objects=objects,
                data_size=data_size,
                key=self._key,
            )

    def close(self) -> None:
        for slot in self._all():
            slot.close()
