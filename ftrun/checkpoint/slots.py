"""Snapshot buffers ("slots") and the host-memory tier built from them.

A slot is one shared-memory file holding every tensor of this rank's state back to back (4 KiB
aligned, so the worker can write to storage with O_DIRECT straight from it). With a job id the
slots are named files under `/dev/shm/ftrun-<uid>/<job>/rank<R>/`, each with a JSON manifest, so they
outlive the rank process and a restart in place restores from them;
without one they are anonymous memfds that die with the rank. Either way the persist worker reads
them by path, so there is exactly one copy of the state in host memory per slot.

Memory bound: `memory_slots` (3 by default, 2 where the tier has no room for 3) x this rank's state bytes, allocated up front with
posix_fallocate (a full /dev/shm is an error at allocation, never a SIGBUS mid-copy). Running out
is never fatal (capacity.py): a slot that cannot be reserved in the tier becomes anonymous memory
(`Slot.go_anonymous`, still a buffer for the persist), and a manifest that cannot be written is
left unwritten and recorded in `MemoryTier.failed` for the Manager to step the tier down.

Integrity of a memory snapshot rests on ordering, not on a checksum (a CRC32 of 4.5 GiB would cost
~1 s of CPU per step): a slot's manifest is deleted before its data is overwritten and written
(temp + rename) only after the copy is complete, so a rank killed at any moment leaves either a
complete snapshot with a manifest or none. tmpfs survives the rank process but not the host.

/dev/shm is writable by every user and the tier's name is easy to guess, so the tier trusts only
what this user made: every job's tier is under one per-user parent, `/dev/shm/ftrun-<uid>/`, made
0700 (no other user can reach into it, so nothing can be planted under it); the parent,
`<job>/` and `rank<R>/` are refused, with a clear error, when they already exist owned by another
uid, open to group or others, or as a link (the Manager then goes on without the tier and says
why); the slot files are opened O_NOFOLLOW and refused unless they are regular files of ours with
mode 0600; every manifest carries an HMAC and the objects are a sealed pickle (auth.py), so a
snapshot that does not verify is skipped with a warning and restore falls back to storage.
"""

from __future__ import annotations

import errno
import hashlib
import json
import mmap
import os
import stat
import warnings
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ftrun import private
from ftrun.checkpoint import auth, device_copy, sample_digest, storage
from ftrun.checkpoint.config import REPLICA_DIR, memory_user_dir_name
from ftrun.checkpoint.errors import CheckpointError, UnsafePathError

ALIGN = 4096  # O_DIRECT-friendly: the worker writes straight from the slot
MADV_POPULATE_WRITE = 23  # Linux >= 5.14; not exported by Python's mmap module
MEMORY_FORMAT = "ftrun-memory/1"
TIER_HINT = (
    "another user may have made it to read or replace your checkpoints: remove it if it is a "
    "leftover of yours, or keep the memory tier elsewhere with "
    "ftrun.checkpoint.Manager(memory_root=...)"
)


@dataclass(frozen=True)
class TensorEntry:
    key: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def layout(tensors: list[tuple[str, torch.Tensor]]) -> tuple[list[TensorEntry], int]:
    """Place tensors back to back, ALIGN-aligned; returns the entries and the padded total size."""
    entries, offset = [], 0
    for key, t in tensors:
        offset = (offset + ALIGN - 1) // ALIGN * ALIGN
        nbytes = t.numel() * t.element_size()
        entries.append(
            TensorEntry(key, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, nbytes)
        )
        offset += nbytes
    return entries, (offset + ALIGN - 1) // ALIGN * ALIGN  # the padded tail of the last one too


def signature(entries: list[TensorEntry], world_size: int) -> str:
    """Identifies a layout: the same keys, dtypes and shapes on the same world size."""
    spec = [(e.key, e.dtype, e.shape) for e in entries] + [world_size]
    return hashlib.sha1(json.dumps(spec).encode()).hexdigest()


class Slot:
    """One snapshot buffer: a shared-memory file mapped into this process. Its files are
    `<name>.data`, `.objects` and `.json` (the manifest): `slot<index>` for the copies, `live`
    for the live snapshot (live.py)."""

    def __init__(self, index: int, directory: Path | None, *, name: str | None = None) -> None:
        self.index = index
        self.directory = directory
        self.name = name or f"slot{index}"
        if directory is not None:
            self.data_path = directory / f"{self.name}.data"
            self.fd = open_slot_file(self.data_path)
            self.path = str(self.data_path)
        else:
            self.fd = os.memfd_create(f"ftrun-ckpt-{self.name}", 0)
            self.path = f"/proc/{os.getpid()}/fd/{self.fd}"
        self.size = os.fstat(self.fd).st_size
        self.mm: mmap.mmap | None = None
        self.base: torch.Tensor | None = None
        # The mapping backs tensors that outlive this object's use of it (the live snapshot's
        # parameters): it is never closed here, only dropped, and unmapped by the last of them.
        self.lent = False
        self._map()

    @property
    def manifest_path(self) -> Path | None:
        return None if self.directory is None else self.directory / f"{self.name}.json"

    @property
    def objects_path(self) -> Path | None:
        return None if self.directory is None else self.directory / f"{self.name}.objects"

    def _map(self) -> None:
        self.populated = False
        self.pinned: bool | None = None  # page-locked for a GPU's copies; None: not asked yet
        if self.size:
            self.mm = mmap.mmap(
                self.fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE
            )
            self.base = torch.frombuffer(self.mm, dtype=torch.uint8)

    def populate(self) -> None:
        """Fault the whole mapping in at once: ~0.3 s/GiB here, against ~1.5-3 s/GiB for the
        page faults of a first copy. Done once per mapping, off the training thread."""
        if self.mm is not None and not self.populated:
            try:
                self.mm.madvise(MADV_POPULATE_WRITE)
            except OSError:  # kernel < 5.14: the first copy takes the faults instead
                pass
            self.populated = True

    def pin(self, device: torch.device) -> None:
        """Page-lock the mapping so that `device`'s copy engine writes into it directly
        (device_copy.py). Tried once per mapping."""
        if self.base is not None and self.pinned is None:
            self.pinned = device_copy.pin(self.base, device)

    def _unmap(self) -> None:
        if self.pinned and self.base is not None:
            device_copy.unpin(self.base)
        self.pinned = None
        self.base = None
        if self.lent:
            self.lent = False
            self.mm = None
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:  # a view is still alive somewhere: let the GC unmap it
                pass
            self.mm = None

    def ensure(self, nbytes: int) -> None:
        """Grow to at least nbytes, reserving the memory now (ENOSPC here, not SIGBUS later)."""
        if nbytes <= self.size:
            return
        self._unmap()
        try:
            os.posix_fallocate(self.fd, 0, nbytes)
        except OSError as exc:
            where = self.directory or "anonymous shared memory"
            free = "" if self.directory is None else f" ({space(self.directory)})"
            raise CheckpointError(
                f"cannot reserve {mib(nbytes)} for a checkpoint snapshot in {where}"
                f"{free}: {os.strerror(exc.errno or errno.ENOSPC)}",
                hint="free memory, enlarge /dev/shm, or checkpoint less state per rank",
            ) from exc
        self.size = os.fstat(self.fd).st_size
        self._map()

    def go_anonymous(self) -> None:
        """Leave the tier: the data becomes an anonymous memfd (RAM, outside the tier root's
        size limit) that dies with the rank, and nothing of this slot is written to the tier
        again (no manifest: a restart restores from storage). The persist worker still reads it
        by path. Frees the slot's space in the tier at once."""
        if self.directory is None:
            return
        self._unmap()
        os.close(self.fd)
        try:
            os.unlink(self.data_path)
        except OSError:
            pass
        self.directory = None
        self.fd = os.memfd_create(f"ftrun-ckpt-{self.name}", 0)
        self.path = f"/proc/{os.getpid()}/fd/{self.fd}"
        self.size = 0
        self._map()

    def give_back(self) -> None:
        """A retired slot (capacity.py): out of the tier, and no memory held at all."""
        self.go_anonymous()
        self._unmap()
        os.ftruncate(self.fd, 0)
        self.size = 0

    def view(self, entry: TensorEntry) -> torch.Tensor:
        assert self.base is not None
        return entry_view(self.base, entry)

    def renew(self) -> None:
        """Replace the data file with a new, empty one (same path). A process that still maps
        the old file (a rank of an older generation on this host, training on as a zombie)
        writes into that one, which nothing reads any more, never into this one."""
        assert self.directory is not None
        self._unmap()
        os.close(self.fd)
        try:
            os.unlink(self.data_path)
        except FileNotFoundError:
            pass
        self.fd = open_slot_file(self.data_path)
        self.size = os.fstat(self.fd).st_size
        self._map()

    def close(self) -> None:
        self._unmap()
        os.close(self.fd)


def open_slot_file(path: Path) -> int:
    """Open (or make, 0600) a slot's data file without following a link, and refuse one that is
    not a regular file of this user's alone: a restart in place reopens the same file."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link where the file goes: refused, never followed
            _refuse_unless_ours(path, os.lstat(path))
        raise CheckpointError(
            f"cannot open the checkpoint snapshot file {path}: {exc.strerror}",
            hint="is /dev/shm full or read-only?",
        ) from None
    try:
        _refuse_unless_ours(path, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refuse_unless_ours(path: Path, st: os.stat_result) -> None:
    private.refuse_unless_ours(
        path,
        st,
        directory=False,
        forbid=private.GROUP_OTHER_ANY,
        what="checkpoint snapshot file",
        hint=TIER_HINT,
        error=UnsafePathError,
    )


def mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:,.0f} MiB"


def space(path: Path) -> str:
    """`/dev/shm: 120 MiB free of 512 MiB`, for the messages of a tier that does not fit."""
    try:
        st = os.statvfs(path)
    except OSError:
        return f"{path}: size unknown"
    return f"{path}: {mib(st.f_bavail * st.f_frsize)} free of {mib(st.f_blocks * st.f_frsize)}"


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

    def leave(self) -> None:
        """Stop keeping snapshots in the tier: every manifest is removed and none is written
        again (a restart restores from storage). The slots stay buffers for the persist: their
        files keep their (reserved) space, or are anonymous memory (`drop_slots`)."""
        self.kept = False
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
                body = storage.read_json_checked(slot.manifest_path, key=self._key)
                if body.get("format") != MEMORY_FORMAT:
                    raise storage.Invalid("unknown format")
                if (body["rank"], body["world_size"], body["signature"]) != (
                    self.rank,
                    self.world_size,
                    sig,
                ):
                    continue  # another layout: not this restore's, nothing wrong with it
                objects = _verified_objects(
                    body, slot.objects_path, os.fstat(slot.fd).st_size, self._key
                )
            except (storage.Invalid, auth.NotAuthentic, OSError, KeyError) as exc:
                skipped.append(f"memory snapshot {slot.manifest_path} is not loaded: {exc}")
                continue
            state.step, state.generation = body["step"], body["generation"]
            state.entries = manifest_entries(body)
            state.objects = objects
            slot.size = os.fstat(slot.fd).st_size
            slot._unmap()
            slot._map()
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
        slot = self.slot(index)
        try:
            self._write_manifest(slot, step, generation, sig, entries, objects, data_size)
        except OSError as exc:
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
            storage.write_file(slot.objects_path, objects, sync=False)
            storage.write_json_atomic(
                slot.manifest_path,
                {
                    "format": MEMORY_FORMAT,
                    "step": step,
                    "generation": generation,
                    "rank": self.rank,
                    "world_size": self.world_size,
                    "signature": sig,
                    "data_size": data_size,
                    "objects_size": len(objects),
                    "objects_crc32": zlib.crc32(objects),
                    "tensors": [
                        [e.key, e.dtype, list(e.shape), e.offset, e.nbytes] for e in entries
                    ],
                    # what restore checks the data against (sample_digest.py)
                    "digest": sample_digest.compute(slot.base, sample_digest.spans_of(entries)),
                },
                key=self._key,
                sync=False,
                compact=True,
            )

    def close(self) -> None:
        for slot in self._all():
            slot.close()


FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.ENOMEM, errno.EIO, errno.EFBIG})


def is_full(exc: BaseException | None) -> bool:
    """Whether `exc` (or what caused it) is the tier running out of space or failing to write:
    what steps the tier down, never a failed job."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def entry_view(base: torch.Tensor, entry: TensorEntry) -> torch.Tensor:
    """The tensor `entry` describes, as a view of the slot's bytes `base`."""
    raw = base[entry.offset : entry.offset + entry.nbytes]
    return raw.view(getattr(torch, entry.dtype)).view(entry.shape)


def manifest_entries(body: dict) -> list[TensorEntry]:
    """The tensors a memory manifest lists (commit() writes them)."""
    return [TensorEntry(k, d, tuple(s), o, n) for k, d, s, o, n in body["tensors"]]


def _verified_objects(body: dict, objects_path: Path, data_size: int, key: bytes) -> bytes:
    """The sealed objects of the snapshot whose (authenticated) manifest is `body`, after the
    data file (`data_size` bytes) and the objects file are checked against it."""
    if data_size < body["data_size"]:
        raise storage.Invalid("data file is short")
    objects = storage.read_regular(objects_path, private_file=True)
    if len(objects) != body["objects_size"] or zlib.crc32(objects) != body["objects_crc32"]:
        raise storage.Invalid("objects file does not match")
    auth.unseal(key, objects)
    return objects


@dataclass(frozen=True)
class HostSnapshot:
    """A valid snapshot in this host's memory tier, of whichever rank and layout wrote it (a
    rank here, or a rank of another host whose replica a peer pushed here)."""

    step: int
    generation: int
    rank: int
    world_size: int
    entries: dict[str, TensorEntry]  # by key
    objects: bytes
    data_path: Path
    manifest_path: Path
    manifest_inode: int  # the manifest read: the same one after the data means it did not change
    signature: str = ""  # its layout's (signature()): a rank's own snapshot in the same layout

    def unchanged(self) -> bool:
        """Whether the snapshot is still the one scanned (a writer deletes the manifest before it
        overwrites the data and writes a new one after: peercopy/files.py's rule)."""
        try:
            return os.lstat(self.manifest_path).st_ino == self.manifest_inode
        except OSError:
            return False

    @contextmanager
    def mapped(self) -> Iterator[Callable[[TensorEntry], torch.Tensor]]:
        """Map the data read-only; yields entry -> a view of its tensor (valid inside only)."""
        fd = os.open(self.data_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            _refuse_unless_ours(self.data_path, os.fstat(fd))
            size = os.fstat(fd).st_size
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ) if size else None
        finally:
            os.close(fd)
        try:
            with warnings.catch_warnings():  # "not writable": read-only is the point
                warnings.simplefilter("ignore", UserWarning)
                base = torch.frombuffer(mm, dtype=torch.uint8) if mm is not None else None

            def view(entry: TensorEntry) -> torch.Tensor:
                assert base is not None
                return entry_view(base, entry)

            yield view
        finally:
            base = None
            if mm is not None:
                try:
                    mm.close()
                except BufferError:  # a view escaped: the GC unmaps it
                    pass


def scan_host(tier: Path, *, key: bytes) -> tuple[list[HostSnapshot], list[str]]:
    """Every valid snapshot in the job's memory tier `tier` on this host, whatever its rank and
    layout: the ranks' own (`rank<R>/`) and the replicas of other hosts' ranks that the peer
    copy keeps here (`replica/rank<R>/`, docs/peercopy.md): what a shrink or a re-plan can
    restore from without storage. Returns them and why the ones that do not verify were
    skipped; a directory that is not ours alone is passed over."""
    found: list[HostSnapshot] = []
    skipped: list[str] = []
    ranks: list[Path] = []
    for parent in (tier, tier / REPLICA_DIR):
        try:
            ranks += sorted(d for d in parent.iterdir() if d.name.startswith("rank"))
        except OSError:
            continue
    for directory in ranks:
        try:
            st = os.lstat(directory)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
                continue
            manifests = sorted(directory.glob("slot*.json")) + sorted(directory.glob("live.json"))
        except OSError:
            continue
        for manifest in manifests:
            base = manifest.with_suffix("")
            data, objects_path = base.with_suffix(".data"), base.with_suffix(".objects")
            try:
                inode = os.lstat(manifest).st_ino
                body = storage.read_json_checked(manifest, key=key)
                if body.get("format") != MEMORY_FORMAT:
                    raise storage.Invalid("unknown format")
                st = os.lstat(data)
                if not stat.S_ISREG(st.st_mode):
                    raise storage.Invalid("data file is not a regular file")
                objects = _verified_objects(body, objects_path, st.st_size, key)
                entries = {e.key: e for e in manifest_entries(body)}
            except (storage.Invalid, auth.NotAuthentic, OSError, KeyError, ValueError) as exc:
                skipped.append(f"memory snapshot {manifest} is not loaded: {exc}")
                continue
            found.append(
                HostSnapshot(
                    body["step"],
                    body["generation"],
                    body["rank"],
                    body["world_size"],
                    entries,
                    objects,
                    data,
                    manifest,
                    inode,
                    body["signature"],
                )
            )
    return found, skipped
