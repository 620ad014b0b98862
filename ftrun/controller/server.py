"""The controller's end of the control plane: accepts agents, authenticates them, keeps their
heartbeats, and turns everything they say into (agent_id, message) items on one inbox queue:
each message decoded here, once, into its class (wire/inbound.py), so nothing past this edge
reads a dict or a kind string.

A connection that closes, or an agent silent for host_lost_timeout_s, becomes an `agent_lost`
item: the supervisor treats both as evidence that the host is gone. A message that fails
authentication or parsing is dropped and logged; it never takes the controller down. Silence
alone is weak evidence on a busy machine: how it is judged (slow, not lost, while the process
runs; never right after our own loop stalled) is silence.py's.

A bug while reading one agent's messages is reported (TaskSupervisor.report) and loses that
agent, the way a closed connection does, rather than leaving it connected and unheard.

Before its hello a connection is a stranger's (docs/security.md): at most MAX_PREAUTH of them
at once beyond the agents still awaited, and none that would take the controller's last
FD_HEADROOM descriptors (more are closed as they are accepted: listener.py); each has
HELLO_TIMEOUT_S for the whole handshake, and frames of at most PREAUTH_MAX_FRAME_BYTES. What is
turned away is counted and told without flooding (refusals.py). The hello binds the connection
to a role and an identity for its life (hello.py): an agent id the controller started and that
is not already connected, or a client (`ftrun chaos`/`ftrun hosts`); messages.py holds each to
what its role may say.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import ssl
import time
from typing import Any

from ftrun.controller.hello import HELLO_TIMEOUT_S, AgentLink, handshake
from ftrun.controller.lateness import Lateness
from ftrun.controller.listener import Listener
from ftrun.controller.output_acks import OutputAcks
from ftrun.controller.refusals import Refusals
from ftrun.controller.silence import EventSink, Liveness, SilenceWatch
from ftrun.errors import ProtocolError
from ftrun.tasks import TaskSupervisor
from ftrun.wire.inbound import AgentLost, Heartbeat, Hello, Message, Report, typed
from ftrun.wire.messages import MAX_LINE, Role

log = logging.getLogger("ftrun.controller")

# Connections not yet past their hello, beyond the agents we are waiting for (thousands of them
# connect at once when a big job starts): this bounds what strangers can hold.
MAX_PREAUTH = 256
# Descriptors kept for the controller's own use (logs, the journal, agents' pipes): a stranger's
# connection that would eat into them is closed at once. Linux gives the lowest free number,
# so a new socket's number tells how full the table is, at no cost.
FD_HEADROOM = 32

CLIENT_REFUSALS_TOLD = 4


class ControlServer:
    def __init__(
        self,
        secret: str,
        *,
        expected_agents: set[str],
        heartbeat_interval_s: float,
        host_lost_timeout_s: float,
        local_stall_timeout_s: float = 0.0,
        alive: Liveness | None = None,
        on_event: EventSink | None = None,
        tasks: TaskSupervisor | None = None,
    ) -> None:
        self.secret = secret
        self.tasks = tasks or TaskSupervisor()
        self.expected = expected_agents
        self.heartbeat_interval_s = heartbeat_interval_s
        self.host_lost_timeout_s = host_lost_timeout_s
        self.local_stall_timeout_s = local_stall_timeout_s
        self.alive = alive
        self.on_event = on_event
        self.inbox: asyncio.Queue[tuple[str, Message]] = asyncio.Queue()
        self.links: dict[str, AgentLink] = {}
        # Each agent's numbered output: duplicates dropped here, acks on our heartbeats.
        self.output_acks = OutputAcks()
        self.silence = SilenceWatch(
            heartbeat_interval_s=heartbeat_interval_s,
            host_lost_timeout_s=host_lost_timeout_s,
            local_stall_timeout_s=local_stall_timeout_s,
            alive=alive,
            on_event=on_event,
            lose=self._lose,
            acked=self.output_acks.acked,
        )
        self.clients: dict[str, AgentLink] = {}
        self.refusals = Refusals(on_event)
        self._preauth = 0
        self._listener: Listener | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self._clients = 0

    @property
    def lateness(self) -> Lateness:
        """This period's heartbeat lateness and loop lag so far (silence.py)."""
        return self.silence.lateness

    async def start(
        self, host: str = "127.0.0.1", port: int = 0, *, tls: ssl.SSLContext | None = None
    ) -> int:
        self._listener = Listener(
            accepted=self._accepted,
            exhausted=self.refusals.exhausted,
            tls=tls,
            handshake_timeout_s=HELLO_TIMEOUT_S,
        )
        self._fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        bound = self._listener.start(host, port)
        self.tasks.spawn("heartbeat check", self._heartbeat_loop, restart=True)
        return bound

    async def _heartbeat_loop(self) -> None:
        """Heartbeats out and the silence check, until close() (silence.py)."""
        await self.silence.loop()

    def _accepted(self, conn: socket.socket, peer: Any) -> None:
        """A new connection: refused at once past the pre-auth cap, else served in a task that
        holds one pre-auth place until its hello is in (or it is refused)."""
        awaited = max(0, len(self.expected) - self.silence.watched())
        if self._preauth >= MAX_PREAUTH + awaited:
            conn.close()
            self.refusals.connection(peer, f"{self._preauth} are already waiting to authenticate")
            return
        if conn.fileno() >= self._fd_limit - FD_HEADROOM:
            conn.close()
            self.refusals.connection(peer, "the controller is short of file descriptors")
            return
        self._preauth += 1
        task = asyncio.get_running_loop().create_task(self._serve_accepted(conn, peer))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _serve_accepted(self, conn: socket.socket, peer: Any) -> None:
        assert self._listener is not None
        try:
            reader, writer = await self._listener.streams(conn)
        except (OSError, asyncio.TimeoutError, ConnectionError) as e:
            self._preauth -= 1
            self.refusals.connection(
                peer, f"TLS handshake failed ({str(e)[:120] or type(e).__name__})"
            )
            return
        await self._serve(reader, writer)

    def send(self, agent_id: str, kind: str, **fields: Any) -> None:
        link = self.links.get(agent_id) or self.clients.get(agent_id)
        if link is not None and not link.lost:
            try:
                link.channel.send(kind, **fields)
            except ProtocolError as e:  # too big for a frame: a bug here, never the peer's doing
                log.error("did not send %s to %s: %s", kind, agent_id, e)

    def host_of(self, agent_id: str) -> str | None:
        """The host an agent said in its hello (which the fleet started it on)."""
        link = self.links.get(agent_id)
        return link.host if link is not None else None

    def broadcast(self, kind: str, **fields: Any) -> None:
        for agent_id in list(self.links):
            self.send(agent_id, kind, **fields)

    async def close(self) -> None:
        self.silence.stop()  # and reports the last period's figures
        for link in [*self.links.values(), *self.clients.values()]:
            link.channel.close()
        if self._listener is not None:
            self._listener.close()
        self.refusals.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve_connection(reader, writer)
        except Exception as e:  # noqa: BLE001 - a bug serving one peer is reported, not fatal
            self.tasks.report(f"serving {writer.get_extra_info('peername')}", e)
            writer.close()

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        peer = writer.get_extra_info("peername")
        try:  # the pre-auth place was taken in _accepted
            admitted = await asyncio.wait_for(
                handshake(
                    reader,
                    writer,
                    self.secret,
                    expected=self.expected,
                    links=self.links,
                    client_id=self._next_client_id,
                ),
                HELLO_TIMEOUT_S,
            )
        except (
            ProtocolError,
            asyncio.TimeoutError,
            asyncio.IncompleteReadError,
            ConnectionError,
            OSError,
        ) as e:
            self.refusals.connection(peer, str(e)[:200] or type(e).__name__)
            writer.close()
            return
        finally:
            self._preauth -= 1
        link, hello = admitted
        if link.role is Role.CLIENT:
            self.clients[link.agent_id] = link
        else:
            self.links[link.agent_id] = link
            if isinstance(hello, Hello):
                self.output_acks.hello(link.agent_id, pid=hello.pid, rejoin=bool(hello.rejoin))
            self.silence.watch(link)
            await self.inbox.put((link.agent_id, hello))
        try:
            await self._read(link)
        except Exception as e:  # noqa: BLE001 - reported, and the link is lost, not the loop
            failure = self.tasks.report(f"reading {link.host}", e)
            self._lose(link, f"the controller failed reading its messages ({failure.error})")

    def _next_client_id(self) -> str:
        self._clients += 1
        return f"client#{self._clients}"

    async def _read(self, link: AgentLink) -> None:
        reason = "its connection closed"
        while not link.lost:
            try:
                msg = typed(link.role, await link.channel.receive())
            except ProtocolError as e:
                self.refuse(link.agent_id, None, str(e))
                # `ftrun chaos` waits for an answer: give it one. A CLI sends one request; a
                # client that sends more and never reads must not grow our write buffer.
                if link.role is Role.CLIENT and link.refusals_told < CLIENT_REFUSALS_TOLD:
                    link.refusals_told += 1
                    link.channel.send("refused", message=str(e)[:MAX_LINE])
                continue
            except (asyncio.IncompleteReadError, ConnectionError, OSError) as e:
                reason = f"its connection closed ({e.__class__.__name__})"
                break
            now = time.monotonic()
            beat = isinstance(msg, Heartbeat)
            if link.role is Role.AGENT:
                self.silence.heard(link, beat, now)
            link.last_seen = now
            if isinstance(msg, Report) and msg.oseq is not None:
                if not self.output_acks.fresh(link.agent_id, msg.oseq):
                    continue  # sent again after a reconnection: we have it already
            if not beat:
                await self.inbox.put((link.agent_id, msg))
        self._lose(link, reason)

    def refuse(self, sender: str, msg: Message | None, why: str) -> None:
        """A message dropped for what it says (its shape, or who sent it): see refusals.py."""
        self.refusals.message(sender, msg.KIND if msg is not None else None, why)

    def drop(self, agent_id: str, reason: str) -> None:
        """Stop talking to an agent we no longer trust (it fences for lack of our heartbeats)."""
        link = self.links.get(agent_id)
        if link is not None:
            link.lost = True  # no agent_lost item: the caller handles the loss itself
            link.channel.close()
            self.silence.forget(agent_id)
            log.warning("dropped %s: %s", agent_id, reason)

    def _lose(self, link: AgentLink, reason: str) -> None:
        if link.lost:
            return
        link.lost = True
        link.channel.close()
        self.silence.forget(link.agent_id)
        if link.role is Role.CLIENT:
            self.clients.pop(link.agent_id, None)
            return
        self.inbox.put_nowait(
            (
                link.agent_id,
                AgentLost(
                    reason=reason,
                    host=link.host,
                    t=time.time(),
                    # The last we heard of it: when the host was last known alive, the fault's
                    # time as well as we can know it (within a heartbeat interval).
                    last_heard_t=time.time() - (time.monotonic() - link.last_seen),
                ),
            )
        )
