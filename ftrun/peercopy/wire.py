"""One snapshot over an agent-to-agent connection, at a bounded rate.

The connection is protocol.py's (the handshake under the job secret, a key per direction, every
frame HMAC'd and numbered), between two agents of one job: the client says a `hello` with its
generation, the server answers what it is asked. A snapshot is a `snapshot` message (rank, slot,
step, generation, sizes), then its manifest, its objects and its data as blobs (frames of at
most 1 MiB), then `end`. A slot the rank rewrites while it is sent is not finished: the sender
closes the connection, and the receiver, which wrote into its oldest slot (never its newest
snapshot), drops it; it never keeps a torn one.

Not encrypted: the bytes are the model's parameters and optimizer state, which the ranks of
these same hosts already exchange in the clear over gloo or NCCL every step (docs/security.md).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from ftrun.errors import ProtocolError
from ftrun.peercopy import files
from ftrun.wire.protocol import Channel

SEND_TIMEOUT_S = 30.0  # a receiver that stops reading for this long is given up on
# Within a snapshot, the longest wait for its next frame: a sender whose host lost power says
# nothing (no FIN, no RST), and the receiver must not hold the replica's lock until TCP gives up.
BLOB_TIMEOUT_S = 10.0


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


class SourceChanged(Exception):
    """The rank rewrote the slot while it was being sent: the rest would be torn."""


async def send_snapshot(
    chan: Channel, directory: Path, snap: files.Snapshot, pacer: Pacer, *, locked: bool = False
) -> int:
    """Send slot `snap` of `directory`; returns the bytes sent. SourceChanged when the rank
    rewrote it meanwhile: the caller must close the connection (the receiver, still waiting
    for data, drops what it got). `locked`: nobody writes the directory meanwhile (a replica
    under its store's lock)."""
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
    for blob in (snap.manifest, objects):
        for i in range(0, len(blob), files.CHUNK):
            chan.send_blob(blob[i : i + files.CHUNK])
    for chunk in files.data_chunks(directory, snap):
        await pacer.take(len(chunk))
        chan.send_blob(chunk)
        await chan.drain(SEND_TIMEOUT_S)
        if not locked and not files.unchanged(directory, snap):
            raise SourceChanged(f"slot {snap.slot} of rank {snap.rank} was rewritten")
    if not locked and not files.unchanged(directory, snap):
        raise SourceChanged(f"slot {snap.slot} of rank {snap.rank} was rewritten")
    chan.send("end", ok=True)
    await chan.drain(SEND_TIMEOUT_S)
    return snap.data_size + len(objects) + len(snap.manifest)


async def receive_snapshot(
    chan: Channel,
    header: dict[str, Any],
    directory: Path,
    *,
    refusal: Callable[[], str | None] = lambda: None,
) -> files.Snapshot | None:
    """Receive the snapshot `header` announced into `directory` (the slot files.slot_for picks);
    returns it once committed, None when it was not worth keeping (older than what is held).
    `refusal` is asked right before the commit (generation fencing: a newer generation may have
    come meanwhile): a reason there raises ProtocolError and nothing is committed."""
    rank, key = int(header["rank"]), (int(header["step"]), int(header["generation"]))
    manifest = b"".join([part async for part in _blobs(chan, int(header["manifest_size"]))])
    objects = b"".join([part async for part in _blobs(chan, int(header["objects_size"]))])
    slot = files.slot_for(directory, rank, key)
    writer = None if slot is None else files.SlotWriter(directory, slot)
    try:
        async for chunk in _blobs(chan, int(header["data_size"])):
            if writer is not None:
                writer.write(chunk)
        end = await asyncio.wait_for(chan.receive(), BLOB_TIMEOUT_S)
        if end["kind"] != "end" or not end["ok"]:
            raise ProtocolError(f"expected the end of the snapshot, got {end['kind']!r}")
        if writer is None:
            return None
        _check_manifest(manifest, rank, key, int(header["data_size"]))
        if (why := refusal()) is not None:
            raise ProtocolError(f"not kept: {why}")
        writer.commit(objects, manifest)
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    return files.read_manifest(directory, rank, writer.slot)


def _check_manifest(manifest: bytes, rank: int, key: tuple[int, int], data_size: int) -> None:
    """The manifest says what the header said: a slot that would not load is never committed."""
    try:
        body = json.loads(manifest)
        said = (int(body["rank"]), (int(body["step"]), int(body["generation"])))
        size = int(body["data_size"])
    except (ValueError, KeyError, TypeError):
        raise ProtocolError("the snapshot's manifest is not one") from None
    if said != (rank, key) or size != data_size:
        raise ProtocolError("the snapshot's manifest does not match its header")


async def _blobs(chan: Channel, size: int) -> AsyncIterator[memoryview]:
    """The blobs that make up `size` bytes, as they come."""
    left = size
    while left > 0:
        part = await asyncio.wait_for(chan.receive_blob(), BLOB_TIMEOUT_S)
        if len(part) > left:
            raise ProtocolError("more bytes than the snapshot said")
        left -= len(part)
        yield part
