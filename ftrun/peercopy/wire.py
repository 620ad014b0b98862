"""One snapshot over an agent-to-agent connection, at a bounded rate.

The connection is protocol.py's (the handshake under the job secret, a key per direction, every
frame HMAC'd and numbered), between two agents of one job: the client says a `hello` with its
generation, the server answers what it is asked. A snapshot is a `snapshot` message (rank, slot,
step, generation, sizes), then its manifest, its objects and its data as blobs (frames of at
most 1 MiB), then `end` saying whether the source stayed the same while it was read: a slot the
rank rewrote in the meantime is dropped by the receiver, never kept torn.

Not encrypted: the bytes are the model's parameters and optimizer state, which the ranks of
these same hosts already exchange in the clear over gloo or NCCL every step (docs/security.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ftrun.checkpoint.storage import Invalid
from ftrun.errors import ProtocolError
from ftrun.peercopy import files
from ftrun.protocol import Channel

SEND_TIMEOUT_S = 30.0  # a receiver that stops reading for this long is given up on


class Pacer:
    """A token bucket: at most `rate` bytes/s on average, bursts of one second's worth, so the
    copy does not take the network (or the cores) from training. rate 0: unbounded."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.tokens = rate
        self.last = time.monotonic()

    async def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        now = time.monotonic()
        self.tokens = min(self.rate, self.tokens + (now - self.last) * self.rate)
        self.last = now
        self.tokens -= n
        if self.tokens < 0:
            await asyncio.sleep(-self.tokens / self.rate)


async def send_snapshot(
    chan: Channel, directory: Path, snap: files.Snapshot, pacer: Pacer, *, locked: bool = False
) -> tuple[bool, int]:
    """Send slot `snap` of `directory`; returns (whether it stayed the same, bytes sent).
    `locked`: nobody writes the directory meanwhile (a replica under its store's lock)."""
    objects = files.read_objects(directory, snap)
    chan.send(
        "snapshot",
        rank=snap.rank,
        slot=snap.slot,
        step=snap.step,
        generation=snap.generation,
        manifest_size=len(snap.manifest),
        objects_size=len(objects),
        data_size=snap.data_size,
    )
    sent = 0
    for blob in (snap.manifest, objects):
        for i in range(0, len(blob), files.CHUNK):
            chan.send_blob(blob[i : i + files.CHUNK])
    ok = True
    try:
        for chunk in files.data_chunks(directory, snap):
            await pacer.take(len(chunk))
            chan.send_blob(chunk)
            sent += len(chunk)
            await chan.drain(SEND_TIMEOUT_S)
            if not locked and not files.unchanged(directory, snap):
                ok = False  # rewritten under us: the rest would be torn; send zeros instead
                break
    except (OSError, Invalid):
        ok = False
    if not ok:  # the receiver still counts on data_size bytes
        for pad in _zeros(snap.data_size - sent):
            chan.send_blob(pad)
    ok = ok and (locked or files.unchanged(directory, snap))
    chan.send("end", ok=ok)
    await chan.drain(SEND_TIMEOUT_S)
    return ok, sent + len(objects) + len(snap.manifest)


def _zeros(n: int) -> list[bytes]:
    full, rest = divmod(n, files.CHUNK)
    return [bytes(files.CHUNK)] * full + ([bytes(rest)] if rest else [])


async def receive_snapshot(
    chan: Channel, header: dict[str, Any], directory: Path
) -> files.Snapshot | None:
    """Receive the snapshot `header` announced into its slot of `directory`; returns it when it
    arrived whole (committed), None when the sender said it changed (the slot is left invalid)."""
    manifest = b"".join([part async for part in _blobs(chan, int(header["manifest_size"]))])
    objects = b"".join([part async for part in _blobs(chan, int(header["objects_size"]))])
    writer = files.SlotWriter(directory, int(header["slot"]))
    try:
        async for chunk in _blobs(chan, int(header["data_size"])):
            writer.write(chunk)
        end = await chan.receive()
        if end["kind"] != "end":
            raise ProtocolError(f"expected the end of the snapshot, got {end['kind']!r}")
        if not end["ok"]:
            writer.abort()
            return None
        writer.commit(objects, manifest)
    except BaseException:
        writer.abort()
        raise
    return files.read_manifest(directory, int(header["rank"]), int(header["slot"]))


async def _blobs(chan: Channel, size: int) -> AsyncIterator[bytes]:
    """The blobs that make up `size` bytes, as they come."""
    left = size
    while left > 0:
        part = await chan.receive_blob()
        if len(part) > left:
            raise ProtocolError("more bytes than the snapshot said")
        left -= len(part)
        yield part
