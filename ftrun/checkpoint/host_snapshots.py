"""The snapshots in this host's memory tier, of every rank and layout: what a restore that is
not in place (a shrink, a re-plan, another layout) can read without storage (reshard.py).

The ranks' own (`rank<R>/`) and the replicas of other hosts' ranks that the peer copy keeps
here (`replica/rank<R>/`, docs/peercopy.md). Each is checked as a rank's own restore checks its
slots (memory_manifest.py); a directory that is not ours alone is passed over, and the data is
mapped read-only, from a file refused unless it is ours (slot_file.py).
"""

from __future__ import annotations

import mmap
import os
import stat
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from ftrun.checkpoint import auth, storage
from ftrun.checkpoint.config import REPLICA_DIR
from ftrun.checkpoint.memory_manifest import manifest_entries, read_manifest, verified_objects
from ftrun.checkpoint.slot_file import refuse_unless_ours
from ftrun.checkpoint.slot_layout import TensorEntry, entry_view


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
            refuse_unless_ours(self.data_path, os.fstat(fd))
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
                body = read_manifest(manifest, key=key)
                st = os.lstat(data)
                if not stat.S_ISREG(st.st_mode):
                    raise storage.Invalid("data file is not a regular file")
                objects = verified_objects(body, objects_path, st.st_size, key)
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
