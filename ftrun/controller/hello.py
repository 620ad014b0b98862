"""Who is on the other end of a control connection: the handshake (keys, then the hello) that
binds it to a role and an identity for its life, and the AgentLink that the server keeps for it.

An agent is admitted only under an id the controller started and that is not already connected;
anything else is refused, and told to fence (an agent of ours that lost us and came back after
we dropped it would otherwise keep its ranks for its grace). A `ftrun chaos`/`ftrun hosts`
client is admitted under an id of its own. The hello itself is held to its role's schema
(messages.py) like every message after it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass

from ftrun.errors import ProtocolError
from ftrun.wire.inbound import ClientHello, Hello, typed
from ftrun.wire.messages import Role, validate
from ftrun.wire.protocol import Channel, accept_channel

HELLO_TIMEOUT_S = 5.0


@dataclass
class AgentLink:
    agent_id: str
    host: str
    pid: int
    channel: Channel
    last_seen: float
    last_heartbeat: float | None = None
    lost: bool = False
    role: Role = Role.AGENT  # or CLIENT: a `ftrun chaos`/`ftrun hosts` client, not a host
    refusals_told: int = 0  # a client's refused requests answered (CLIENT_REFUSALS_TOLD at most)


async def handshake(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    secret: str,
    *,
    expected: Container[str],
    links: Mapping[str, AgentLink],
    client_id: Callable[[], str],
) -> tuple[AgentLink, Hello | ClientHello]:
    """Keys, then the hello, which fixes who the peer is for the connection's life: an agent
    in `expected` and not live in `links`, or a client named by `client_id()`. ProtocolError
    when it may not connect. The hello comes back typed (inbound.py), like every message after
    it."""
    channel = await accept_channel(reader, writer, secret, HELLO_TIMEOUT_S)
    body = await channel.receive()
    if body["kind"] != "hello":
        raise ProtocolError(f"first message is {str(body['kind'])[:40]!r}, not a hello")
    role = Role.CLIENT if body.get("role") in ("client", "chaos") else Role.AGENT
    hello = typed(role, validate(role, body))
    if isinstance(hello, ClientHello):
        agent_id, host, pid = client_id(), "client", 0
    else:
        assert isinstance(hello, Hello)
        agent_id = hello.agent_id
        host = "?" if hello.host is None else hello.host  # None: absent (never null)
        pid = 0 if hello.pid is None else hello.pid
        why = None
        if agent_id not in expected:
            why = f"agent {agent_id[:80]!r} is not one this job counts on"
        elif agent_id in links and not links[agent_id].lost:
            why = f"agent {agent_id[:80]!r} is already connected"
        if why is not None:
            # An agent of ours that lost us and came back after we dropped it (a healed
            # partition) would keep its ranks for its grace: tell it to fence now.
            channel.send("fence", reason=why)
            raise ProtocolError(why)
    channel.trust(role)
    return AgentLink(agent_id, host, pid, channel, time.monotonic(), role=role), hello
