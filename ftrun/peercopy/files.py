"""A rank's memory snapshots as files: read one consistently while the rank writes, write one
in the order that makes it all-or-nothing.

ftrun.checkpoint keeps each snapshot of rank R in `/dev/shm/ftrun-<job>/rank<R>/` as three files
per slot (checkpoint/slots.py): `slot<i>.data` (the tensors), `slot<i>.objects` (the sealed
pickle) and `slot<i>.json` (the manifest, HMAC'd). The rank deletes a slot's manifest before it
overwrites its data and writes it (temp + rename) only once the copy is whole. So a reader that
finds the same manifest file (same inode) before and after reading the data read a snapshot that
did not change under it; and a writer that follows the same order leaves a whole snapshot or an
invalid slot, never a torn one. The replica of another host's ranks is kept the same way, in
`replica/rank<R>/`, so a fetched replica is a memory tier the ranks restore from as they are.

No torch, no checkpoint key: the agent moves the bytes; the ranks check them when they restore.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ftrun import private
from ftrun.checkpoint.config import REPLICA_DIR
from ftrun.checkpoint.errors import UnsafePathError
from ftrun.checkpoint.storage import Invalid, read_regular

SLOTS = 3  # ftrun.checkpoint keeps 2 or 3 (memory_slots)
KEPT = 2  # slots a replica (or a fetch) fills: every rank scans at least these
CHUNK = (1 << 20) - 4096  # one frame of the wire (1 MiB with its tag and length)
MAX_MANIFEST_BYTES = 1 << 20
MAX_OBJECTS_BYTES = 1 << 30
PER_RANK_PREFIX = "__rank"  # checkpoint/state.py storage_key: a PerRank tensor's name


def rank_dir(tier: Path, rank: int) -> Path:
    return tier / f"rank{int(rank)}"


def replica_dir(tier: Path, rank: int) -> Path:
    return tier / REPLICA_DIR / f"rank{int(rank)}"


def paths(directory: Path, slot: int) -> tuple[Path, Path, Path]:
    """(data, objects, manifest) of one slot."""
    base = directory / f"slot{int(slot)}"
    return Path(f"{base}.data"), Path(f"{base}.objects"), Path(f"{base}.json")


@dataclass(frozen=True)
class Snapshot:
    """What a slot's manifest says, read without its key: enough to move the slot."""

    rank: int
    slot: int
    step: int
    generation: int
    data_size: int
    manifest: bytes
    inode: tuple[int, int]  # (st_ino, st_mtime_ns): the manifest file this was read from

    @property
    def key(self) -> tuple[int, int]:
        return self.step, self.generation


def snapshots(directory: Path, rank: int) -> list[Snapshot]:
    """The slots of `directory` that hold a manifest now, newest first."""
    found = []
    for slot in range(SLOTS):
        snap = read_manifest(directory, rank, slot)
        if snap is not None:
            found.append(snap)
    return sorted(found, key=lambda s: s.key, reverse=True)


def tensor_keys(snap: Snapshot) -> set[tuple[str, str, tuple[int, ...]]] | None:
    """(name, dtype, shape) of every tensor the snapshot holds that a restore into another
    layout matches on (checkpoint/restore.py), as its manifest lists them: not the rank's own
    `PerRank` tensors (named `__rank<R>__.…`, checkpoint/state.py's storage_key), which only
    the same rank restores, and only under the same world size."""
    try:
        tensors = json.loads(snap.manifest)["tensors"]
        return {
            (str(t[0]), str(t[1]), tuple(int(d) for d in t[2]))
            for t in tensors
            if not str(t[0]).startswith(PER_RANK_PREFIX)
        }
    except (ValueError, KeyError, TypeError, IndexError):
        return None  # not readable here: the receiving rank's restore judges it


def covering(snaps: list[Snapshot]) -> list[Snapshot]:
    """The snapshots, in order, that hold a tensor none before them holds: in data parallel
    the first rank's alone (every rank holds every tensor), in a pipeline one per stage."""
    covered: set[tuple[str, str, tuple[int, ...]]] = set()
    chosen = []
    for snap in snaps:
        keys = tensor_keys(snap)
        if keys is None or not keys <= covered:
            chosen.append(snap)
            covered |= keys or set()
    return chosen


def stamps(directory: Path) -> tuple[object, ...]:
    """Which manifest file each slot has now ((inode, mtime) or None): cheap to compare."""
    out: list[object] = []
    for slot in range(SLOTS):
        try:
            st = os.lstat(paths(directory, slot)[2])
            out.append((st.st_ino, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


def read_manifest(directory: Path, rank: int, slot: int) -> Snapshot | None:
    manifest = paths(directory, slot)[2]
    try:
        st = os.lstat(manifest)
        data = read_regular(manifest, limit=MAX_MANIFEST_BYTES, private_file=True)
        body = json.loads(data)
        snap = Snapshot(
            rank=int(body["rank"]),
            slot=slot,
            step=int(body["step"]),
            generation=int(body["generation"]),
            data_size=int(body["data_size"]),
            manifest=data,
            inode=(st.st_ino, st.st_mtime_ns),
        )
    except (OSError, Invalid, ValueError, KeyError, TypeError):
        return None  # none, being replaced, or not one of ours: not a snapshot to move
    return snap if snap.rank == rank and snap.data_size >= 0 else None


def unchanged(directory: Path, snap: Snapshot) -> bool:
    """The slot still holds the manifest `snap` was read from: its data did not change since."""
    try:
        st = os.lstat(paths(directory, snap.slot)[2])
    except OSError:
        return False
    return (st.st_ino, st.st_mtime_ns) == snap.inode


def read_objects(directory: Path, snap: Snapshot) -> bytes:
    return read_regular(paths(directory, snap.slot)[1], limit=MAX_OBJECTS_BYTES, private_file=True)


def data_chunks(directory: Path, snap: Snapshot) -> Iterator[bytes]:
    """The slot's data, CHUNK bytes at a time (the file may be longer: slots only grow)."""
    fd = os.open(paths(directory, snap.slot)[0], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        offset = 0
        while offset < snap.data_size:
            chunk = os.pread(fd, min(CHUNK, snap.data_size - offset), offset)
            if not chunk:
                raise Invalid(f"slot {snap.slot} of rank {snap.rank} is shorter than its manifest")
            offset += len(chunk)
            yield chunk
    finally:
        os.close(fd)


def ensure_dir(directory: Path) -> None:
    """Make the directory (and missing parents) 0700; refuse one that is not ours alone."""
    private.ensure_dir(
        directory,
        forbid=private.GROUP_OTHER_ANY,
        what="checkpoint memory tier",
        hint="remove it if it is a leftover of yours",
        error=UnsafePathError,
    )


class SlotWriter:
    """Writes one slot of `directory`: invalidate, data, objects, then the manifest last."""

    def __init__(self, directory: Path, slot: int) -> None:
        self.directory, self.slot = directory, slot
        self.data, self.objects, self.manifest = paths(directory, slot)
        ensure_dir(directory)
        try:
            os.unlink(self.manifest)  # from here on the slot is invalid until commit()
        except FileNotFoundError:
            pass
        self.fd = os.open(self.data, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self.offset = 0

    def write(self, chunk: bytes | memoryview) -> None:
        view = memoryview(chunk)
        while view:
            n = os.pwrite(self.fd, view, self.offset)
            view, self.offset = view[n:], self.offset + n

    def commit(self, objects: bytes, manifest: bytes) -> None:
        os.close(self.fd)
        self.fd = -1
        _replace(self.objects, objects)
        _replace(self.manifest, manifest)

    def abort(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def slot_for(directory: Path, rank: int, key: tuple[int, int]) -> int | None:
    """Where a snapshot `key` (step, generation) arriving for `directory` goes: a slot without a
    snapshot, else the one with the oldest, if `key` is newer than it; None: it is not worth
    keeping. The newest snapshot held is never the one overwritten, so a push that fails half
    way costs only the oldest. Newer means a newer generation first, then a later step: after a
    restore to an earlier step, the new generation's snapshots are the timeline that goes on."""
    held = {s.slot: (s.generation, s.step) for s in snapshots(directory, rank)}
    empty = [slot for slot in range(KEPT) if slot not in held]
    if empty:
        return empty[0]
    oldest = min(range(KEPT), key=lambda slot: held[slot])
    incoming = (key[1], key[0])
    return oldest if incoming > held[oldest] and incoming not in held.values() else None


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    os.replace(tmp, path)
