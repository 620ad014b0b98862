"""The controller's end of the control plane: accepts agents, authenticates them, keeps their
heartbeats, and turns everything they say into (agent_id, message) items on one inbox queue.

A connection that closes, or an agent silent for host_lost_timeout_s, becomes an `agent_lost`
item: the supervisor treats both as evidence that the host is gone. A message that fails
authentication or parsing is dropped and logged; it never takes the controller down. A bug while
reading one agent's messages is reported (TaskSupervisor.report) and loses that agent, the way a
closed connection does, rather than leaving it connected and unheard.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ftrun.errors import ProtocolError
from ftrun.protocol import Channel, accept_channel
from ftrun.tasks import TaskSupervisor

log = logging.getLogger("ftrun.controller")

HELLO_TIMEOUT_S = 5.0
LOSS_CHECK_INTERVAL_S = 0.05


@dataclass
class AgentLink:
    agent_id: str
    host: str
    pid: int
    channel: Channel
    last_seen: float
    lost: bool = False
    role: str = "agent"  # or "chaos": a `ftrun chaos` client, not a host


class ControlServer:
    def __init__(self, secret: str, *, expected_agents: set[str], heartbeat_interval_s: float,
                 host_lost_timeout_s: float, tasks: TaskSupervisor | None = None) -> None:
        self.secret = secret
        self.tasks = tasks or TaskSupervisor()
        self.expected = expected_agents
        self.heartbeat_interval_s = heartbeat_interval_s
        self.host_lost_timeout_s = host_lost_timeout_s
        self.inbox: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self.links: dict[str, AgentLink] = {}
        # Live agent links, least recently heard first: the silence check looks only at the head.
        self._by_last_seen: OrderedDict[str, AgentLink] = OrderedDict()
        self.clients: dict[str, AgentLink] = {}
        self.dropped_messages = 0
        self._server: asyncio.base_events.Server | None = None
        self._clients = 0
        self._heartbeats: asyncio.Task[None] | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        # A deep backlog: thousands of agents connect at once when a big job starts.
        self._server = await asyncio.start_server(self._serve, host, port, backlog=4096)
        self.tasks.spawn("heartbeat check", self._heartbeat_loop, restart=True)
        return self._server.sockets[0].getsockname()[1]

    def send(self, agent_id: str, kind: str, **fields: Any) -> None:
        link = self.links.get(agent_id) or self.clients.get(agent_id)
        if link is not None and not link.lost:
            link.channel.send(kind, **fields)

    def broadcast(self, kind: str, **fields: Any) -> None:
        for agent_id in list(self.links):
            self.send(agent_id, kind, **fields)

    async def close(self) -> None:
        if self._heartbeats is not None:
            self._heartbeats.cancel()
        for link in [*self.links.values(), *self.clients.values()]:
            link.channel.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve_connection(reader, writer)
        except Exception as e:
            self.tasks.report(f"serving {writer.get_extra_info('peername')}", e)
            writer.close()

    async def _serve_connection(self, reader: asyncio.StreamReader,
                                writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            channel = await accept_channel(reader, writer, self.secret)
            hello = await asyncio.wait_for(channel.receive(), HELLO_TIMEOUT_S)
            role = hello.get("role", "agent")
            agent_id = hello.get("agent_id")
            if role == "chaos" and hello["kind"] == "hello":
                self._clients += 1
                agent_id = f"chaos#{self._clients}"
            elif hello["kind"] != "hello" or agent_id not in self.expected or (
                    agent_id in self.links and not self.links[agent_id].lost):
                raise ProtocolError(f"unexpected first message {hello['kind']!r} from {agent_id!r}")
        except (ProtocolError, asyncio.TimeoutError, asyncio.IncompleteReadError,
                ConnectionError, OSError) as e:
            self.dropped_messages += 1
            log.warning("refused a connection from %s: %s", peer, e)
            writer.close()
            return
        link = AgentLink(agent_id, str(hello.get("host")), int(hello.get("pid", 0)), channel,
                         time.monotonic(), role=role)
        if role == "chaos":
            self.clients[agent_id] = link
        else:
            self.links[agent_id] = link
            self._by_last_seen[agent_id] = link
            await self.inbox.put((agent_id, hello))
        try:
            await self._read(link)
        except Exception as e:
            failure = self.tasks.report(f"reading {link.host}", e)
            self._lose(link, f"the controller failed reading its messages ({failure.error})")

    async def _read(self, link: AgentLink) -> None:
        reason = "its connection closed"
        while not link.lost:
            try:
                msg = await link.channel.receive()
            except ProtocolError as e:
                self.dropped_messages += 1
                log.warning("dropped a message from %s: %s", link.host, e)
                continue
            except (asyncio.IncompleteReadError, ConnectionError, OSError) as e:
                reason = f"its connection closed ({e.__class__.__name__})"
                break
            link.last_seen = time.monotonic()
            if link.role == "agent":
                self._by_last_seen.move_to_end(link.agent_id)
            if msg["kind"] != "heartbeat":
                await self.inbox.put((link.agent_id, msg))
        self._lose(link, reason)

    def drop(self, agent_id: str, reason: str) -> None:
        """Stop talking to an agent we no longer trust (it fences for lack of our heartbeats)."""
        link = self.links.get(agent_id)
        if link is not None:
            link.lost = True  # no agent_lost item: the caller handles the loss itself
            link.channel.close()
            self._by_last_seen.pop(agent_id, None)
            log.warning("dropped %s: %s", agent_id, reason)

    def _lose(self, link: AgentLink, reason: str) -> None:
        if link.lost:
            return
        link.lost = True
        link.channel.close()
        self._by_last_seen.pop(link.agent_id, None)
        if link.role == "chaos":
            self.clients.pop(link.agent_id, None)
            return
        self.inbox.put_nowait((link.agent_id, {"kind": "agent_lost", "reason": reason,
                                               "host": link.host, "t": time.time()}))

    async def _heartbeat_loop(self) -> None:
        # Check silence more often than we send, so detection is bounded by the timeout plus one
        # short tick; each check costs O(agents lost), not O(agents), thanks to the ordering.
        self._heartbeats = asyncio.current_task()  # this run of it: close() cancels it
        next_send = 0.0
        while True:
            now = time.monotonic()
            while self._by_last_seen:
                link = next(iter(self._by_last_seen.values()))
                silent = now - link.last_seen
                if silent <= self.host_lost_timeout_s:
                    break
                self._lose(link, f"no heartbeat for {silent:.2f} s")
            if now >= next_send:
                next_send = now + self.heartbeat_interval_s
                for link in list(self._by_last_seen.values()):
                    link.channel.send("heartbeat")
            await asyncio.sleep(LOSS_CHECK_INTERVAL_S)
