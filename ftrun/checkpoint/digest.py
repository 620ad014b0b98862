"""The checksum a manifest records for each file, and the check of a file against it.

Tensor data is checksummed with XXH3-64: the persist worker reads every byte it writes to
compute it, and on the 2-core reference VM zlib's CRC32 ran at 2.3 GB/s, 2.1 s of a core for
4.5 GiB of state, taken from training at every persist; XXH3 runs at 15 GB/s (`python
scripts/bench_throughput.py` has the effect on training). Small files (pickles, metadata,
manifests) keep CRC32, which costs nothing at their size. Each manifest entry names its
algorithm ({"size", "xxh3"} or {"size", "crc32"}), so checkpoints written before keep verifying.

Neither is a defence against an attacker (XXH3 and CRC32 can both be forged): that is the
manifest's HMAC and the pickles' seal (auth.py). These catch torn and corrupted files.
"""

from __future__ import annotations

import mmap
import os
import zlib
from typing import Any

import xxhash

Buffer = memoryview | bytes | bytearray | mmap.mmap

DATA = "xxh3"  # the entry key for tensor data
LEGACY = "crc32"
CHUNK = 8 << 20  # read size when verifying a file


class DataDigest:
    """XXH3-64 over a stream of buffers (releases the GIL, so it overlaps the write)."""

    def __init__(self) -> None:
        self._state = xxhash.xxh3_64()

    def update(self, data: Buffer) -> None:
        self._state.update(data)

    def entry(self, size: int) -> dict[str, int]:
        return {"size": size, DATA: self._state.intdigest()}


def file_digest(fd: int, algorithm: str) -> int:
    """The `algorithm` checksum of an open file, read in chunks; closes fd."""
    state = xxhash.xxh3_64() if algorithm == DATA else None
    crc = 0
    with open(fd, "rb", buffering=0) as f:
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            if state is not None:
                state.update(view[:n])
            else:
                crc = zlib.crc32(view[:n], crc)
    return state.intdigest() if state is not None else crc


def mismatch(fd: int, want: dict[str, Any]) -> str | None:
    """Why the open file does not match its manifest entry's checksum, or None when it does
    (closes fd)."""
    algorithm = DATA if DATA in want else LEGACY
    if algorithm not in want:
        os.close(fd)
        return "has no checksum in the manifest"
    if file_digest(fd, algorithm) != want[algorithm]:
        return f"fails its {'XXH3' if algorithm == DATA else 'CRC32'} check"
    return None
