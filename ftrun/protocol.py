"""The control-plane wire format between the controller and its agents.

One TCP connection per agent, both ways. Each frame is

    length (4 bytes, big-endian) | HMAC-SHA256 tag (32 bytes) | JSON body

The tag is keyed with a per-connection key derived from the per-job secret and a random nonce
the server sends first, so a frame captured on one connection is worthless on another, and a
strictly increasing ``seq`` in every body makes a frame replayed on the same connection stale.
Bodies carry the protocol version; frames over MAX_FRAME_BYTES are refused before reading them.

asyncio streams rather than grpcio or pyzmq: the controller's load is thousands of tiny,
latency-sensitive messages, which one event loop serves without threads or a compiled dependency
that would also have to exist on every remote host (the agent needs only psutil).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import struct
from typing import Any

from ftrun.errors import ProtocolError

VERSION = 1
MAX_FRAME_BYTES = 1 << 20
NONCE_BYTES = 16
_LENGTH = struct.Struct("!I")
_TAG_BYTES = 32


def new_secret() -> str:
    return os.urandom(32).hex()


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def connection_key(secret: str, nonce: bytes) -> bytes:
    return hmac.new(bytes.fromhex(secret), b"ftrun-conn" + nonce, hashlib.sha256).digest()


def encode(body: dict[str, Any], key: bytes) -> bytes:
    payload = json.dumps(body, separators=(",", ":")).encode()
    tag = hmac.new(key, payload, hashlib.sha256).digest()
    frame_len = len(tag) + len(payload)
    if frame_len > MAX_FRAME_BYTES:
        raise ProtocolError(f"message of {frame_len} bytes exceeds {MAX_FRAME_BYTES}")
    return _LENGTH.pack(frame_len) + tag + payload


def decode(frame: bytes, key: bytes) -> dict[str, Any]:
    """Authenticate and parse one frame (without its length prefix)."""
    if len(frame) <= _TAG_BYTES:
        raise ProtocolError("frame too short")
    tag, payload = frame[:_TAG_BYTES], frame[_TAG_BYTES:]
    if not hmac.compare_digest(tag, hmac.new(key, payload, hashlib.sha256).digest()):
        raise ProtocolError("bad authentication tag")
    try:
        body = json.loads(payload)
    except ValueError as e:
        raise ProtocolError(f"body is not JSON: {e}") from None
    if not isinstance(body, dict) or not isinstance(body.get("kind"), str):
        raise ProtocolError("body is not an object with a kind")
    if body.get("v") != VERSION:
        raise ProtocolError(f"unsupported protocol version {body.get('v')!r}")
    if not isinstance(body.get("seq"), int):
        raise ProtocolError("body has no integer seq")
    return body


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    """Read one length-prefixed frame. Raises IncompleteReadError on EOF, ProtocolError if too big."""
    header = await reader.readexactly(_LENGTH.size)
    (length,) = _LENGTH.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
    return await reader.readexactly(length)


class Channel:
    """One authenticated direction-pair on a stream: numbers what it sends, refuses replays."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: bytes
    ) -> None:
        self.reader = reader
        self.writer = writer
        self._key = key
        self._sent_seq = 0
        self._recv_seq = 0

    def send(self, kind: str, **fields: Any) -> None:
        """Queue a message; never blocks (the transport buffers). Errors surface on the next read."""
        self._sent_seq += 1
        body = {"v": VERSION, "kind": kind, "seq": self._sent_seq, **fields}
        if not self.writer.is_closing():
            self.writer.write(encode(body, self._key))

    async def receive(self) -> dict[str, Any]:
        """Next valid message. ProtocolError for a bad message, which the caller drops and logs;
        IncompleteReadError / ConnectionError when the peer is gone or the stream is unusable."""
        try:
            frame = await read_frame(self.reader)
        except ProtocolError as e:  # an oversized frame leaves the stream unreadable
            raise ConnectionResetError(str(e)) from None
        body = decode(frame, self._key)
        if body["seq"] <= self._recv_seq:
            raise ProtocolError(f"replayed or reordered message seq={body['seq']}")
        self._recv_seq = body["seq"]
        return body

    async def drain(self, timeout_s: float) -> None:
        """Wait until what was sent has left, at most timeout_s (asyncio.TimeoutError after):
        a peer that stops reading must not hold the sender up."""
        await asyncio.wait_for(self.writer.drain(), timeout_s)

    def close(self) -> None:
        self.writer.close()


# The nonce is 16-odd bytes into an empty socket buffer: only a dead peer could block it.
NONCE_SEND_TIMEOUT_S = 5.0


async def open_channel(host: str, port: int, secret: str, timeout_s: float) -> Channel:
    """Client side of the handshake: connect, read the server's nonce, derive the key."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    nonce = await asyncio.wait_for(reader.readexactly(NONCE_BYTES), timeout_s)
    return Channel(reader, writer, connection_key(secret, nonce))


async def accept_channel(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, secret: str
) -> Channel:
    """Server side of the handshake: send a fresh nonce."""
    nonce = new_nonce()
    writer.write(nonce)
    await asyncio.wait_for(writer.drain(), NONCE_SEND_TIMEOUT_S)
    return Channel(reader, writer, connection_key(secret, nonce))
