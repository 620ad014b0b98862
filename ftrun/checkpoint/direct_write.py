"""The persist worker's writes: a snapshot's bytes from its slot into a storage file.

Pure Python, no torch (worker.py). Each file is written with O_DIRECT where the filesystem takes
it (no page-cache copy, ~0.05 s CPU per GiB), buffered where it refuses (tmpfs); checksummed
(XXH3, digest.py) while the previous chunk is written, both releasing the GIL, so the checksum
costs no wall time; and paced to the persist's bandwidth, so the writes leave the training
loop its share of the disk and the cores.
"""

from __future__ import annotations

import errno
import mmap
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ftrun.checkpoint import digest, storage

BLOCK = (
    4096  # alignment of offsets and lengths for O_DIRECT (== slot_layout.ALIGN == dcp_layout.ALIGN)
)

Item = tuple[int, int, int]  # (slot offset, bytes, file offset)


class Throttle:
    """Paces writes to `rate` bytes/s (0: no limit) across all files of one persist."""

    def __init__(self, rate: float) -> None:
        self.rate, self.sent, self.t0 = rate, 0, time.monotonic()

    def __call__(self, nbytes: int) -> None:
        self.sent += nbytes
        if self.rate > 0:
            ahead = self.sent / self.rate - (time.monotonic() - self.t0)
            if ahead > 0:
                time.sleep(ahead)  # pacing I/O, not waiting for anything


def write_file(
    path: Path, mm: mmap.mmap, items: list[Item], throttle: Throttle
) -> tuple[int, dict[str, int]]:
    """Write items to a new file with O_DIRECT, or buffered where the filesystem refuses
    O_DIRECT (tmpfs); returns (fd, manifest entry): the caller fsyncs and closes it. The file is
    made new either way (storage.create_file: 0600, never through a link)."""
    if hasattr(os, "O_DIRECT"):
        try:
            fd = storage.create_file(path, os.O_DIRECT)
            try:
                return fd, write_items(fd, mm, items, throttle)
            except OSError as exc:
                os.close(fd)
                if exc.errno != errno.EINVAL:
                    raise
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
    fd = storage.create_file(path)
    return fd, write_items(fd, mm, items, throttle)


def write_items(fd: int, mm: mmap.mmap, items: list[Item], throttle: Throttle) -> dict[str, int]:
    """Copy (slot_offset, nbytes, file_offset) items from the snapshot into fd.

    Offsets are BLOCK-aligned on both sides and every item is zero-padded to a whole BLOCK, so
    the same writes work with O_DIRECT. The checksum of a chunk (XXH3, digest.py) is computed
    while the previous chunk is being written (both release the GIL): no extra wall time.
    """
    checksum, pos = digest.DataDigest(), 0
    view = memoryview(mm)
    bounce = mmap.mmap(-1, BLOCK)  # page-aligned, for zero-padded tails
    pending: Future[None] | None = None
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ftrun-ckpt-write") as writer:
        try:
            for slot_off, nbytes, file_off in sorted(items, key=lambda it: it[2]):
                segments: list[memoryview] = []
                if file_off > pos:  # never with BLOCK-aligned plans; kept for safety
                    segments.append(memoryview(bytes(file_off - pos)))
                full = nbytes // BLOCK * BLOCK
                for start in range(slot_off, slot_off + full, storage.CHUNK):
                    segments.append(view[start : min(start + storage.CHUNK, slot_off + full)])
                for seg in segments:
                    checksum.update(seg)
                    if pending is not None:
                        pending.result()
                    pending = writer.submit(_pwrite_all, fd, seg, pos)
                    pos += len(seg)
                    throttle(len(seg))
                tail = nbytes - full
                if tail:
                    if pending is not None:
                        pending.result()
                        pending = None
                    bounce[:] = bytes(BLOCK)
                    bounce[:tail] = view[slot_off + full : slot_off + nbytes]
                    checksum.update(bounce)
                    _pwrite_all(fd, memoryview(bounce), pos)
                    pos += BLOCK
            if pending is not None:
                pending.result()
        finally:
            view.release()
            bounce.close()
    return checksum.entry(pos)


def _pwrite_all(fd: int, buf: memoryview, pos: int) -> None:
    while buf:
        n = os.pwrite(fd, buf, pos)
        buf, pos = buf[n:], pos + n
