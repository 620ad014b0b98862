"""The controller's end of the control plane: accepts agents, authenticates them, keeps their
heartbeats, and turns everything they say into (agent_id, message) items on one inbox queue.

A connection that closes, or an agent silent for host_lost_timeout_s, becomes an `agent_lost`
item: the supervisor treats both as evidence that the host is gone. A message that fails
authentication or parsing is dropped and logged; it never takes the controller down.

Silence alone is weak evidence on a busy machine, so two things keep it honest
(docs/timeouts.md):
- an agent whose process the transport knows to be alive (a local agent) is *slow*, not lost:
  an `agent_slow` event, then `agent_recovered` when it speaks again; it is lost when its
  process exits, or after local_stall_timeout_s of silence (0: never);
- when our own loop wakes up late (we were stalled, not the agents), the silence check waits one
  tick, so that the heartbeats waiting in our socket buffers are read before anyone is judged.
Heartbeat lateness and our loop's lag are journaled every STATS_INTERVAL_S (`heartbeat_stats`).

A bug while reading one agent's messages is reported (TaskSupervisor.report) and loses that
agent, the way a closed connection does, rather than leaving it connected and unheard.

Before its hello a connection is a stranger's (docs/security.md): at most MAX_PREAUTH of them
at once beyond the agents still awaited, and none that would take the controller's last
FD_HEADROOM descriptors (more are closed as they are accepted: listener.py); each has
HELLO_TIMEOUT_S for the whole handshake, and frames of at most PREAUTH_MAX_FRAME_BYTES. What is
turned away is counted and told without flooding (refusals.py). The hello binds the connection
to a role and an identity for its life: an agent id the controller started and that is not already connected, or a client
(`ftrun chaos`/`ftrun hosts`); messages.py holds each to what its role may say.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ftrun.controller.lateness import Lateness
from ftrun.controller.listener import Listener
from ftrun.controller.refusals import Refusals
from ftrun.errors import ProtocolError
from ftrun.messages import MAX_LINE, Role, validate
from ftrun.protocol import Channel, accept_channel
from ftrun.tasks import TaskSupervisor

log = logging.getLogger("ftrun.controller")

HELLO_TIMEOUT_S = 5.0
# Connections not yet past their hello, beyond the agents we are waiting for (thousands of them
# connect at once when a big job starts): this bounds what strangers can hold.
MAX_PREAUTH = 256
# Descriptors kept for the controller's own use (logs, the journal, agents' pipes): a stranger's
# connection that would eat into them is closed at once. Linux gives the lowest free number,
# so a new socket's number tells how full the table is, at no cost.
FD_HEADROOM = 32
LOSS_CHECK_INTERVAL_S = 0.05
# A silence check that wakes this much later than asked was stalled itself: it defers one tick.
STALLED_TICK_S = 0.1
STATS_INTERVAL_S = 10.0

# Transport knowledge of an agent's process: True alive, False gone, None unknown (remote).
Liveness = Callable[[str], "bool | None"]
EventSink = Callable[..., Any]


CLIENT_REFUSALS_TOLD = 4


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
        self.inbox: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self.links: dict[str, AgentLink] = {}
        # Live agent links, least recently heard first: the silence check looks only at the head.
        self._by_last_seen: OrderedDict[str, AgentLink] = OrderedDict()
        # Silent past the timeout but alive (the transport says so): slow, watched every tick.
        self._slow: dict[str, AgentLink] = {}
        self.lateness = Lateness(heartbeat_interval_s)
        self.clients: dict[str, AgentLink] = {}
        self.refusals = Refusals(on_event)
        self._preauth = 0
        self._listener: Listener | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self._clients = 0
        self._heartbeats: asyncio.Task[None] | None = None

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

    def _accepted(self, conn: socket.socket, peer: Any) -> None:
        """A new connection: refused at once past the pre-auth cap, else served in a task that
        holds one pre-auth place until its hello is in (or it is refused)."""
        awaited = max(0, len(self.expected) - len(self._by_last_seen) - len(self._slow))
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
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            self._report_lateness()  # the last period's figures
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
            admitted = await asyncio.wait_for(self._handshake(reader, writer), HELLO_TIMEOUT_S)
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
            self._by_last_seen[link.agent_id] = link
            await self.inbox.put((link.agent_id, hello))
        try:
            await self._read(link)
        except Exception as e:  # noqa: BLE001 - reported, and the link is lost, not the loop
            failure = self.tasks.report(f"reading {link.host}", e)
            self._lose(link, f"the controller failed reading its messages ({failure.error})")

    async def _handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[AgentLink, dict[str, Any]]:
        """Keys, then the hello, which fixes who the peer is for the connection's life."""
        channel = await accept_channel(reader, writer, self.secret, HELLO_TIMEOUT_S)
        hello = await channel.receive()
        if hello["kind"] != "hello":
            raise ProtocolError(f"first message is {str(hello['kind'])[:40]!r}, not a hello")
        role = Role.CLIENT if hello.get("role") in ("client", "chaos") else Role.AGENT
        validate(role, hello)
        if role is Role.CLIENT:
            self._clients += 1
            agent_id, host, pid = f"client#{self._clients}", "client", 0
        else:
            agent_id, host, pid = hello["agent_id"], hello.get("host", "?"), hello.get("pid", 0)
            why = None
            if agent_id not in self.expected:
                why = f"agent {agent_id[:80]!r} is not one this job counts on"
            elif agent_id in self.links and not self.links[agent_id].lost:
                why = f"agent {agent_id[:80]!r} is already connected"
            if why is not None:
                # An agent of ours that lost us and came back after we dropped it (a healed
                # partition) would keep its ranks for its grace: tell it to fence now.
                channel.send("fence", reason=why)
                raise ProtocolError(why)
        channel.trust(role)
        return AgentLink(agent_id, host, pid, channel, time.monotonic(), role=role), hello

    async def _read(self, link: AgentLink) -> None:
        reason = "its connection closed"
        while not link.lost:
            try:
                msg = await link.channel.receive()
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
            if link.role is Role.AGENT:
                self._heard(link, msg["kind"] == "heartbeat", now)
            link.last_seen = now
            if msg["kind"] != "heartbeat":
                await self.inbox.put((link.agent_id, msg))
        self._lose(link, reason)

    def refuse(self, sender: str, msg: dict[str, Any] | None, why: str) -> None:
        """A message dropped for what it says (its shape, or who sent it): see refusals.py."""
        self.refusals.message(sender, str(msg.get("kind"))[:40] if msg else None, why)

    def _heard(self, link: AgentLink, heartbeat: bool, now: float) -> None:
        if heartbeat:
            if link.last_heartbeat is not None:
                self.lateness.heartbeat_gap(now - link.last_heartbeat)
            link.last_heartbeat = now
        if self._slow.pop(link.agent_id, None) is not None:
            silent = now - link.last_seen
            log.warning("%s speaks again after %.2f s of silence", link.agent_id, silent)
            self._event(
                "agent_recovered", host=link.host, agent=link.agent_id, silent_s=round(silent, 3)
            )
            self._by_last_seen[link.agent_id] = link
        else:
            self._by_last_seen.move_to_end(link.agent_id)

    def _event(self, kind: str, **fields: Any) -> None:
        if self.on_event is not None:
            self.on_event(kind, **fields)

    def drop(self, agent_id: str, reason: str) -> None:
        """Stop talking to an agent we no longer trust (it fences for lack of our heartbeats)."""
        link = self.links.get(agent_id)
        if link is not None:
            link.lost = True  # no agent_lost item: the caller handles the loss itself
            link.channel.close()
            self._by_last_seen.pop(agent_id, None)
            self._slow.pop(agent_id, None)
            log.warning("dropped %s: %s", agent_id, reason)

    def _lose(self, link: AgentLink, reason: str) -> None:
        if link.lost:
            return
        link.lost = True
        link.channel.close()
        self._by_last_seen.pop(link.agent_id, None)
        self._slow.pop(link.agent_id, None)
        if link.role is Role.CLIENT:
            self.clients.pop(link.agent_id, None)
            return
        self.inbox.put_nowait(
            (
                link.agent_id,
                {
                    "kind": "agent_lost",
                    "reason": reason,
                    "host": link.host,
                    "t": time.time(),
                    # The last we heard of it: when the host was last known alive, the fault's
                    # time as well as we can know it (within a heartbeat interval).
                    "last_heard_t": time.time() - (time.monotonic() - link.last_seen),
                },
            )
        )

    async def _heartbeat_loop(self) -> None:
        # Check silence more often than we send, so detection is bounded by the timeout plus one
        # short tick; each check costs O(agents lost or slow), not O(agents), thanks to the
        # ordering.
        self._heartbeats = asyncio.current_task()  # this run of it: close() cancels it
        next_send = 0.0
        next_stats = time.monotonic() + STATS_INTERVAL_S
        woke = time.monotonic()
        deferred = False
        while True:
            now = time.monotonic()
            lag = now - woke
            self.lateness.loop_lag(lag)
            if lag > STALLED_TICK_S and not deferred:
                # We were stalled, not (necessarily) the agents: read what they sent meanwhile
                # before judging anyone. At most one tick in a row, so a loop that is always
                # late still checks.
                deferred = True
                self.lateness.deferred_checks += 1
                if lag > self.host_lost_timeout_s / 2:
                    log.warning("the controller's loop stalled for %.2f s", lag)
                    self._event("controller_stalled", stalled_s=round(lag, 3))
            else:
                deferred = False
                self._check_silence(now)
            if now >= next_send:
                next_send = now + self.heartbeat_interval_s
                for link in [*self._by_last_seen.values(), *self._slow.values()]:
                    link.channel.send("heartbeat")
            if now >= next_stats:
                next_stats = now + STATS_INTERVAL_S
                self._report_lateness()
            woke = time.monotonic() + LOSS_CHECK_INTERVAL_S
            await asyncio.sleep(LOSS_CHECK_INTERVAL_S)

    def _check_silence(self, now: float) -> None:
        while self._by_last_seen:
            link = next(iter(self._by_last_seen.values()))
            silent = now - link.last_seen
            if silent <= self.host_lost_timeout_s:
                break
            if self._alive(link):
                # Its process runs: late is not lost (a busy machine, a stalled loop).
                del self._by_last_seen[link.agent_id]
                self._slow[link.agent_id] = link
                log.warning(
                    "%s silent for %.2f s but its process is alive: slow, not lost",
                    link.agent_id,
                    silent,
                )
                self._event(
                    "agent_slow",
                    host=link.host,
                    agent=link.agent_id,
                    pid=link.pid,
                    silent_s=round(silent, 3),
                )
            else:
                self._lose(link, f"no heartbeat for {silent:.2f} s")
        for link in list(self._slow.values()):
            silent = now - link.last_seen
            if not self._alive(link):
                self._lose(link, f"its process exited after {silent:.2f} s of silence")
            elif self.local_stall_timeout_s and silent > self.local_stall_timeout_s:
                self._lose(link, f"alive but silent for {silent:.1f} s (local stall timeout)")

    def _alive(self, link: AgentLink) -> bool:
        return bool(self.alive is not None and self.alive(link.agent_id))

    def _report_lateness(self) -> None:
        stats, self.lateness = self.lateness, Lateness(self.heartbeat_interval_s)
        if stats.heartbeats.n or stats.deferred_checks:
            self._event(
                "heartbeat_stats",
                period_s=STATS_INTERVAL_S,
                agents=len(self._by_last_seen) + len(self._slow),
                slow=len(self._slow),
                **stats.summary(),
            )
