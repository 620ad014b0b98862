from __future__ import annotations

import asyncio
import json
import struct

import pytest

from ftrun.errors import ProtocolError
from ftrun.wire import protocol

SECRET = protocol.new_secret()
KEY = protocol.direction_key(SECRET, protocol.new_nonce(), protocol.new_nonce(), b"c2s")
V = protocol.VERSION


def frame_body(frame: bytes) -> bytes:
    return frame[4:]


def test_round_trip():
    frame = protocol.encode({"v": V, "kind": "launch", "seq": 1, "gen": 3}, KEY)
    assert protocol.decode(frame_body(frame), KEY)["gen"] == 3


@pytest.mark.parametrize(
    "mutate, why",
    [
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "bad authentication tag"),
        (lambda b: b[:10], "frame too short"),
        (lambda b: b[:40], "bad authentication tag"),
    ],
)
def test_tampered_or_truncated_frames_are_refused(mutate, why):
    body = frame_body(protocol.encode({"v": V, "kind": "x", "seq": 1}, KEY))
    with pytest.raises(ProtocolError, match=why):
        protocol.decode(mutate(body), KEY)


def test_wrong_key_is_refused():
    other = protocol.direction_key(protocol.new_secret(), b"s" * 16, b"c" * 16, b"c2s")
    body = frame_body(protocol.encode({"v": V, "kind": "x", "seq": 1}, other))
    with pytest.raises(ProtocolError, match="authentication"):
        protocol.decode(body, KEY)


@pytest.mark.parametrize(
    "body, why",
    [
        ({"v": 1, "kind": "x", "seq": 1}, "version"),
        ({"v": V, "seq": 1}, "kind"),
        ({"v": V, "kind": "x"}, "seq"),
    ],
)
def test_malformed_bodies_are_refused(body, why):
    with pytest.raises(ProtocolError, match=why):
        protocol.decode(frame_body(protocol.encode(body, KEY)), KEY)


def test_oversized_messages_are_refused_both_ways():
    with pytest.raises(ProtocolError, match="exceeds"):
        protocol.encode({"v": V, "kind": "log", "seq": 1, "x": "a" * protocol.MAX_FRAME_BYTES}, KEY)

    async def read_huge():
        reader = asyncio.StreamReader()
        reader.feed_data(struct.pack("!I", protocol.MAX_FRAME_BYTES + 1))
        return await protocol.read_frame(reader)

    with pytest.raises(ProtocolError, match="exceeds"):
        asyncio.run(read_huge())


def test_channel_refuses_replayed_messages():
    async def scenario():
        reader = asyncio.StreamReader()
        first = protocol.encode({"v": V, "kind": "a", "seq": 1}, KEY)
        second = protocol.encode({"v": V, "kind": "b", "seq": 2}, KEY)
        reader.feed_data(first + first + second)
        chan = protocol.Channel(reader, None, send_key=KEY, recv_key=KEY)  # type: ignore[arg-type]
        got = [await chan.receive()]
        with pytest.raises(ProtocolError, match="replayed"):
            await chan.receive()
        got.append(await chan.receive())
        return [m["kind"] for m in got]

    assert asyncio.run(scenario()) == ["a", "b"]


def test_body_is_json_object():
    payload = json.dumps([1, 2]).encode()
    import hashlib
    import hmac

    tag = hmac.new(KEY, payload, hashlib.sha256).digest()
    with pytest.raises(ProtocolError, match="object"):
        protocol.decode(tag + payload, KEY)
