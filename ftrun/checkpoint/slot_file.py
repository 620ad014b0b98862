"""One snapshot buffer ("slot"): a shared-memory file holding every tensor of this rank's state
back to back (slot_layout.py), mapped into the rank.

With a job id a slot is a named file of the memory tier (`/dev/shm/ftrun-<uid>/<job>/rank<R>/`,
slots.py), so it outlives the rank process and a restart in place restores from it; without one
it is an anonymous memfd that dies with the rank. Either way the persist worker reads it by path,
so there is exactly one copy of the state in host memory per slot. Its memory is reserved up
front with posix_fallocate: a full /dev/shm is an error at allocation, never a SIGBUS mid-copy;
a slot that cannot be reserved in the tier becomes anonymous memory (`go_anonymous`, capacity.py).

/dev/shm is writable by every user, so a slot's file is opened O_NOFOLLOW and refused unless it
is a regular file of ours with mode 0600 (`open_slot_file`).
"""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

import torch

from ftrun import private
from ftrun.checkpoint import device_copy
from ftrun.checkpoint.errors import CheckpointError, UnsafePathError
from ftrun.checkpoint.slot_layout import TensorEntry, entry_view
from ftrun.checkpoint.tier_space import mib, space

MADV_POPULATE_WRITE = 23  # Linux >= 5.14; not exported by Python's mmap module
TIER_HINT = (
    "another user may have made it to read or replace your checkpoints: remove it if it is a "
    "leftover of yours, or keep the memory tier elsewhere with "
    "ftrun.checkpoint.Manager(memory_root=...)"
)


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

    def remap(self) -> None:
        """Map the file again at its size now (a restart found a snapshot in it)."""
        self.size = os.fstat(self.fd).st_size
        self._unmap()
        self._map()

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
            refuse_unless_ours(path, os.lstat(path))
        raise CheckpointError(
            f"cannot open the checkpoint snapshot file {path}: {exc.strerror}",
            hint="is /dev/shm full or read-only?",
        ) from None
    try:
        refuse_unless_ours(path, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


def refuse_unless_ours(path: Path, st: os.stat_result) -> None:
    private.refuse_unless_ours(
        path,
        st,
        directory=False,
        forbid=private.GROUP_OTHER_ANY,
        what="checkpoint snapshot file",
        hint=TIER_HINT,
        error=UnsafePathError,
    )
