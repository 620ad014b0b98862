"""Fuzzing the control plane's decoders: whatever arrives, the only outcomes are a message that
passed every check, ProtocolError (dropped and logged), or the end of the stream. Nothing else
may escape, because anything else would be a crash of the controller's reader."""

from __future__ import annotations

import asyncio
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from ftrun.errors import ProtocolError
from ftrun.wire import protocol
from ftrun.wire.messages import SCHEMAS, Role, validate

KEY = protocol.direction_key(protocol.new_secret(), b"s" * 16, b"c" * 16, b"c2s")
FUZZ = settings(max_examples=300, deadline=None)

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=50)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=20,
)
kinds = st.sampled_from(sorted({k for schema in SCHEMAS.values() for k in schema} | {"x", ""}))
field_names = st.sampled_from(
    sorted({f for s in SCHEMAS.values() for sch in s.values() for f in sch.fields} | {"zz"})
)


@FUZZ
@given(st.binary(max_size=300))
def test_decode_of_arbitrary_bytes_only_refuses(data):
    try:
        protocol.decode(data, KEY)
    except ProtocolError:
        pass


@FUZZ
@given(st.sampled_from(list(Role)), kinds, st.dictionaries(field_names, json_values, max_size=8))
def test_validate_of_any_authenticated_body_only_refuses(role, kind, fields):
    body = {"v": protocol.VERSION, "kind": kind, "seq": 1, **fields}
    # Authenticated with the right key, so only the schema stands between it and the reader.
    frame = protocol.encode(body, KEY)[4:]
    try:
        decoded = protocol.decode(frame, KEY)
        validated = validate(role, decoded)
    except ProtocolError:
        return
    assert validated["kind"] in SCHEMAS[role]


@FUZZ
@given(st.binary(max_size=2000), st.integers(min_value=0, max_value=4))
def test_a_channel_fed_arbitrary_bytes_refuses_or_ends(data, framed):
    async def scenario() -> None:
        reader = asyncio.StreamReader()
        # Sometimes a plausible length prefix, so the fuzz reaches the tag and the body.
        reader.feed_data(struct.pack("!I", len(data)) + data if framed else data)
        reader.feed_eof()
        chan = protocol.Channel(
            reader,
            None,  # type: ignore[arg-type]
            send_key=KEY,
            recv_key=KEY,
            peer=Role.AGENT,
            max_frame_bytes=protocol.PREAUTH_MAX_FRAME_BYTES,
        )
        for _ in range(10):
            try:
                await chan.receive()
            except ProtocolError:
                continue
            except (asyncio.IncompleteReadError, ConnectionResetError):
                return

    asyncio.run(scenario())
