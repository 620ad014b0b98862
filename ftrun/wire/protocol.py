"""The control-plane wire format between the controller and its agents.

One TCP connection per agent, both ways. Each frame is

    length (4 bytes, big-endian) | HMAC-SHA256 tag (32 bytes) | JSON body

The handshake: the server sends a fresh nonce, the client answers with one of its own, and each
side derives two keys from the per-job secret and both nonces, one per direction. So a frame
captured on one connection is worthless on another, a frame the controller sent can never be
passed off as the agent's (or back), and neither side alone chooses the keys. A strictly
increasing ``seq`` in every body makes a frame replayed on the same connection stale. Bodies
carry the protocol version. A frame over the reader's limit is refused from its length prefix,
before it is read: the limit is PREAUTH_MAX_FRAME_BYTES until the peer has said a valid hello,
so an unauthenticated peer can make the controller hold a few KiB, not a MiB.

Authenticated is not the same as well-formed: messages.py checks what each role may say, and
Channel.receive applies it once the peer's role is known.

The bytes are authenticated, not encrypted (docs/security.md says why, and what that means).

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
from ftrun.tls import client_context
from ftrun.wire.messages import Role, validate

VERSION = 3  # 3: numbered output (oseq) and its acknowledgement (acked)
MAX_FRAME_BYTES = 1 << 20
# A hello is a few hundred bytes; until a peer has said one, this is all it may send in a frame.
PREAUTH_MAX_FRAME_BYTES = 4096
NONCE_BYTES = 16
_LENGTH = struct.Struct("!I")
_TAG_BYTES = 32


def new_secret() -> str:
    return os.urandom(32).hex()


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def direction_key(secret: str, server_nonce: bytes, client_nonce: bytes, direction: bytes) -> bytes:
    """The key for one direction of one connection: b"c2s" (client to server) or b"s2c"."""
    label = b"ftrun-v2-" + direction + b"\0" + server_nonce + client_nonce
    return hmac.new(bytes.fromhex(secret), label, hashlib.sha256).digest()


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


async def read_frame(reader: asyncio.StreamReader, max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """Read one length-prefixed frame. Raises IncompleteReadError on EOF, ProtocolError if its
    length is over max_bytes (then nothing of it is read)."""
    header = await reader.readexactly(_LENGTH.size)
    (length,) = _LENGTH.unpack(header)
    if length > max_bytes:
        raise ProtocolError(f"frame of {length} bytes exceeds {max_bytes}")
    return await reader.readexactly(length)


class Channel:
    """One authenticated connection: a key per direction; numbers what it sends, refuses
    replays, and once the peer's role is set, refuses what that role may not say."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        send_key: bytes,
        recv_key: bytes,
        peer: Role | None = None,
        max_frame_bytes: int = MAX_FRAME_BYTES,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self._send_key = send_key
        self._recv_key = recv_key
        self.peer = peer  # None: not known yet (the server, before the hello)
        self.max_frame_bytes = max_frame_bytes
        self._sent_seq = 0
        self._recv_seq = 0

    def trust(self, peer: Role) -> None:
        """The peer said a valid hello as `peer`: from now on hold it to that role's schema,
        and let it send full-size frames."""
        self.peer = peer
        self.max_frame_bytes = MAX_FRAME_BYTES

    def send(self, kind: str, **fields: Any) -> None:
        """Queue a message; never blocks (the transport buffers). Errors surface on the next read."""
        self._sent_seq += 1
        body = {"v": VERSION, "kind": kind, "seq": self._sent_seq, **fields}
        if not self.writer.is_closing():
            self.writer.write(encode(body, self._send_key))

    async def receive(self) -> dict[str, Any]:
        """Next valid message. ProtocolError for a bad message, which the caller drops and logs;
        IncompleteReadError / ConnectionError when the peer is gone or the stream is unusable."""
        try:
            frame = await read_frame(self.reader, self.max_frame_bytes)
        except ProtocolError as e:  # an oversized frame leaves the stream unreadable
            raise ConnectionResetError(str(e)) from None
        body = decode(frame, self._recv_key)
        if body["seq"] <= self._recv_seq:
            raise ProtocolError(f"replayed or reordered message seq={body['seq']}")
        self._recv_seq = body["seq"]
        return body if self.peer is None else validate(self.peer, body)

    def send_blob(self, data: bytes) -> None:
        """Queue raw bytes (a snapshot's chunk: the peer tier, ftrun/peercopy): a frame like a
        message's, its tag over the frame's sequence number and the bytes, so a blob cannot be
        replayed, reordered or passed off as a message (nor a message as a blob)."""
        self._sent_seq += 1
        mac = hmac.new(self._send_key, _blob_label(self._sent_seq), hashlib.sha256)
        mac.update(data)  # not label + data: a chunk is megabytes, and a copy of it costs
        tag = mac.digest()
        if len(tag) + len(data) > MAX_FRAME_BYTES:
            raise ProtocolError(f"blob of {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
        if not self.writer.is_closing():
            self.writer.write(_LENGTH.pack(len(tag) + len(data)) + tag)
            self.writer.write(data)

    async def receive_blob(self) -> memoryview:
        """The next frame, which must be a blob; ProtocolError if it is not authentic."""
        try:
            frame = await read_frame(self.reader, self.max_frame_bytes)
        except ProtocolError as e:
            raise ConnectionResetError(str(e)) from None
        self._recv_seq += 1
        view = memoryview(frame)  # slices of it are not copies
        tag, data = view[:_TAG_BYTES], view[_TAG_BYTES:]
        want = hmac.new(self._recv_key, _blob_label(self._recv_seq), hashlib.sha256)
        want.update(data)
        if len(frame) < _TAG_BYTES or not hmac.compare_digest(tag, want.digest()):
            raise ProtocolError("bad authentication tag on a blob")
        return data

    async def drain(self, timeout_s: float) -> None:
        """Wait until what was sent has left, at most timeout_s (asyncio.TimeoutError after):
        a peer that stops reading must not hold the sender up."""
        await asyncio.wait_for(self.writer.drain(), timeout_s)

    def close(self) -> None:
        self.writer.close()

    def abort(self) -> None:
        """Drop the connection now: a TLS close would wait up to 30 s for a silent peer's
        close_notify before the reader learns that the connection is gone."""
        transport = self.writer.transport
        if transport is not None and not transport.is_closing():
            transport.abort()
        else:
            self.writer.close()


def _blob_label(seq: int) -> bytes:
    return b"ftrun-blob\0" + seq.to_bytes(8, "big")


# The nonce is 16-odd bytes into an empty socket buffer: only a dead peer could block it.
NONCE_SEND_TIMEOUT_S = 5.0


async def open_channel(
    host: str,
    port: int,
    secret: str,
    timeout_s: float,
    *,
    cert_pem: str = "",
    server: Role = Role.CONTROLLER,
) -> Channel:
    """Client side of the handshake: connect (over TLS pinned to `cert_pem` when given), read
    the server's nonce, send ours, derive the keys. What the server sends is held to the schema
    of its role `server` (the controller, or another agent's peer store)."""
    tls = client_context(cert_pem) if cert_pem else None
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=tls), timeout_s)
    try:
        server_nonce = await asyncio.wait_for(reader.readexactly(NONCE_BYTES), timeout_s)
        client_nonce = new_nonce()
        writer.write(client_nonce)
    except BaseException:
        writer.close()
        raise
    return Channel(
        reader,
        writer,
        send_key=direction_key(secret, server_nonce, client_nonce, b"c2s"),
        recv_key=direction_key(secret, server_nonce, client_nonce, b"s2c"),
        peer=server,
    )


async def accept_channel(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    secret: str,
    timeout_s: float = NONCE_SEND_TIMEOUT_S,
) -> Channel:
    """Server side of the handshake: send a fresh nonce, read the client's (within timeout_s).
    The channel takes only small frames until the caller trusts the peer's hello."""
    server_nonce = new_nonce()
    writer.write(server_nonce)
    await asyncio.wait_for(writer.drain(), NONCE_SEND_TIMEOUT_S)
    client_nonce = await asyncio.wait_for(reader.readexactly(NONCE_BYTES), timeout_s)
    return Channel(
        reader,
        writer,
        send_key=direction_key(secret, server_nonce, client_nonce, b"s2c"),
        recv_key=direction_key(secret, server_nonce, client_nonce, b"c2s"),
        max_frame_bytes=PREAUTH_MAX_FRAME_BYTES,
    )
