"""The frames between a rank and its persist worker (worker.py, persist_client.py).

Pure Python, no torch: the worker imports it and starts in milliseconds.

Frames are a 4-byte big-endian length + a pickle of a dict of plain values:
  rank → worker on stdin:  {"op": "persist", ...} | {"op": "exit"}
  worker → rank on --reply-fd: {"op": "ready"}, {"op": "released", "step"} once the snapshot
  buffer has been read (the rank may overwrite it), {"op": "done", "step", "ok", "error",
  "path"[, "superseded"]} once this rank's part is durable (rank 0: once the checkpoint is
  committed; "superseded": refused, a newer generation claimed the directory, fence.py).

The frames are pickles, unsealed, and that is safe here: both ends are this rank and its own
child, over an anonymous pipe (the worker's stdin, and an fd it inherits) that no other process
can open; nothing stored is ever read back through them. Everything the worker writes to storage
is 0600 in 0700 directories it checks are this user's, and its manifests carry the checkpoint
key's HMAC, which comes with each "persist" command (auth.py, storage.py).
"""

from __future__ import annotations

import pickle
import struct
from typing import Any, BinaryIO

_HEADER = struct.Struct("!I")


def read_frame(stream: BinaryIO) -> dict[str, Any] | None:
    """The next message on `stream`; None at EOF (the other end is gone)."""
    header = _read_exact(stream, _HEADER.size)
    if header is None:
        return None
    body = _read_exact(stream, _HEADER.unpack(header)[0])
    return None if body is None else pickle.loads(body)


def _read_exact(stream: BinaryIO, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def encode_frame(msg: dict[str, Any]) -> bytes:
    body = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body
