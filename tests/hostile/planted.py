"""What another user of the host plants for ftrun.checkpoint to find: a pickle that runs code when
loaded (it makes a marker directory), padded to a chosen size and forced to a chosen CRC32, so
that sizes and CRC32s alone would let it through."""

from __future__ import annotations

import os
import pickle
import zlib
from pathlib import Path

OTHER_UID = 65534  # nobody: the other user of the host

_POLY = 0xEDB88320
_TABLE: list[int] = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ (_POLY if _c & 1 else 0)
    _TABLE.append(_c)
_BY_TOP_BYTE = {entry >> 24: i for i, entry in enumerate(_TABLE)}  # top bytes are all distinct


class RunsCode:
    """Unpickling it calls os.mkdir(marker): proof that the bytes were loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[override]
        return (os.mkdir, (str(self.marker),))


def force_crc32(data: bytes, target: int) -> bytes:
    """`data` plus 4 bytes whose CRC32 is `target` (CRC32 is linear: no secret protects it)."""
    reg = target ^ 0xFFFFFFFF
    for _ in range(4):  # run the register back over 4 unknown bytes
        index = _BY_TOP_BYTE[reg >> 24]
        reg = (((reg ^ _TABLE[index]) << 8) & 0xFFFFFFFF) | index
    patch = (reg ^ zlib.crc32(data) ^ 0xFFFFFFFF).to_bytes(4, "little")
    forged = data + patch
    assert zlib.crc32(forged) == target
    return forged


def evil_pickle(marker: Path, *, size: int | None = None, crc32: int | None = None) -> bytes:
    """A pickle that makes `marker` when loaded; with `size` (and `crc32`) padded after its STOP
    opcode, which pickle.loads ignores, to exactly that size (and that CRC32)."""
    blob = pickle.dumps(RunsCode(marker), protocol=pickle.HIGHEST_PROTOCOL)
    if size is None:
        return blob
    tail = 4 if crc32 is not None else 0
    assert size >= len(blob) + tail, f"{size} bytes leave no room for a {len(blob)}-byte pickle"
    blob += b"\0" * (size - len(blob) - tail)
    return force_crc32(blob, crc32) if crc32 is not None else blob


def assert_live(blob: bytes, marker: Path) -> None:
    """The planted bytes really run code when unpickled (so a test that they did not is not
    vacuous): loads them once, on purpose, against `marker`, and cleans up."""
    assert not marker.exists()
    pickle.loads(blob)
    assert marker.is_dir(), "the planted pickle did not run"
    marker.rmdir()
