"""The control plane's inbox as the supervise loop reads it, in every phase (agents starting, a
generation running, a teardown, a backoff): the next message within a deadline, and the side
channel, what is handled the same whatever the phase: chaos requests, `ftrun hosts`, agents
connecting and lost, agents' own errors.

Each item is (sender, message), the message typed at the edge (server.py, wire/inbound.py):
what it is, is its class. Every reader handles an item before it asks for the next, so asking
for the next settles the last: an agent's numbered output is acknowledged only once it was
written (or dropped as stale), never while it waits in the queue (controller/output_acks.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from ftrun.controller.chaos import ChaosDesk
from ftrun.controller.fleet import Fleet
from ftrun.controller.generation import GenWatch
from ftrun.controller.internal import InternalFailures
from ftrun.controller.patience import Patience
from ftrun.controller.server import ControlServer
from ftrun.wire.inbound import (
    AgentError,
    AgentLost,
    Hello,
    Hosts,
    Message,
    PreemptNotice,
    Report,
    Stopped,
    StopRequested,
)
from ftrun.wire.inbound_checks import StandbyReady

# What ends a wait between generations early: a stop, or a preemption notice (supervisor.py's
# _interrupted tells them apart).
INTERRUPTIONS = (StopRequested, PreemptNotice)

Item = tuple[str, Message]  # (sender, message)


class Inbox:
    def __init__(
        self,
        server: ControlServer,
        *,
        fleet: Fleet,
        chaos: ChaosDesk,
        internal: InternalFailures,
        host_added: Callable[[str], None] = lambda host: None,
        standby_ready: Callable[[str, StandbyReady], None] = lambda agent, msg: None,
    ) -> None:
        self.standby_ready = standby_ready  # the standby's agent picked its port
        self.server = server
        self.fleet = fleet
        self.chaos = chaos
        self.internal = internal
        # `ftrun hosts add HOST`: the user wants it back; its quarantine in this job is lifted
        # (the job machine's unbench; the CLI refuses one the user's store still holds).
        self.host_added = host_added
        self._taken: Item | None = None  # the item handed out last: handled by now

    async def next(self, deadline: float | None) -> Item | None:
        """The next message; None once `deadline` (monotonic; None: no deadline) has passed."""
        if self._taken is not None:
            agent_id, msg = self._taken
            self._taken = None
            if isinstance(msg, Report) and msg.oseq is not None:
                self.server.output_acks.settled(agent_id, msg.oseq)
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            self._taken = await asyncio.wait_for(self.server.inbox.get(), timeout)
        except asyncio.TimeoutError:
            return None
        return self._taken

    def side_channel(self, sender: str, msg: Message, watch: GenWatch | None) -> bool:
        """Chaos, `ftrun hosts`, agents (re)connecting: handled the same in every phase."""
        if self.chaos.handle(sender, msg, watch):
            return True
        match msg:
            case AgentError():
                self.internal.on_agent_error(sender, msg)
                return True
            case Hosts() if sender in self.server.clients:
                ok, text = self.fleet.request(msg)
                if ok and msg.action == "add" and isinstance(msg.host, str):
                    self.host_added(msg.host)
                self.server.send(sender, "hosts_ack", ok=ok, message=text)
                return True
            case Hello():
                self.fleet.on_hello(sender, msg)
                return True
            case AgentLost() if watch is None or sender not in watch.agents:
                self.fleet.on_lost(sender)
                return True
            case StandbyReady():
                self.standby_ready(sender, msg)
                return True
            case Stopped():
                self.fleet.on_stopped(sender, msg)  # a stopped agent's fresh port
        return False

    async def agents_started(self, waiting: set[str], timeout_s: float) -> bool:
        """Wait for the hello (or the loss) of each agent in `waiting`; those silent past the
        timeout are the fleet's to mark lost. False when a stop was requested meanwhile."""
        deadline = time.monotonic() + timeout_s
        total, patience = len(waiting), Patience(self.fleet.reporter, first_s=3.0)
        while waiting:
            if (got := await self.next(min(deadline, patience.due()))) is None:
                if time.monotonic() < deadline:
                    patience.note(lambda s: self._connecting(waiting, total, s, timeout_s))
                    continue
                self.fleet.never_connected(waiting)
                break
            agent_id, msg = got
            match msg:
                case StopRequested() | PreemptNotice():
                    return False
                case Hello():
                    self.fleet.on_hello(agent_id, msg)
                    waiting.discard(agent_id)
                case AgentLost():
                    self.fleet.on_lost(agent_id)
                    waiting.discard(agent_id)
                case _:
                    self.side_channel(agent_id, msg, None)
        return True

    async def agents_back(self, waiting: set[str], gen: int, timeout_s: float) -> set[str] | None:
        """Wait for the hello again of each agent in `waiting` (a resumed controller adopting
        generation `gen`); those that came back running it. None when a stop was requested."""
        deadline = time.monotonic() + timeout_s
        back: set[str] = set()
        held: list[Item] = []  # what they said meanwhile: for the watch
        while waiting - back:
            if (got := await self.next(deadline)) is None:
                break
            agent_id, msg = got
            match msg:
                case StopRequested() | PreemptNotice():
                    return None
                case Hello():
                    self.fleet.on_hello(agent_id, msg)
                    if agent_id in waiting and msg.rejoin and msg.gen == gen:
                        back.add(agent_id)
                    elif agent_id in waiting:
                        waiting.discard(agent_id)  # back, but its ranks are gone
                case AgentLost():
                    waiting.discard(agent_id)
                case _ if not self.side_channel(agent_id, msg, None):
                    held.append((agent_id, msg))
                    self._taken = None  # not handled: it goes back in the queue
        while not self.server.inbox.empty():  # what came after: behind what was held, in order
            held.append(self.server.inbox.get_nowait())
        for item in held:
            self.server.inbox.put_nowait(item)
        return back

    def _connecting(self, waiting: set[str], total: int, waited: float, limit: float) -> str:
        hosts = sorted(self.fleet.roster.host_of(a) or a for a in waiting)
        shown = ", ".join(hosts[:5]) + (f" and {len(hosts) - 5} more" if len(hosts) > 5 else "")
        return (
            f"connecting: {total - len(waiting)} of {total} agent(s) ready after {waited:.0f} s; "
            f"waiting for {shown} (up to {limit:g} s)"
        )

    async def stop_requested_within(self, delay_s: float) -> bool:
        """Wait `delay_s` (a backoff, a fence), handling the side channel; True when a stop was
        requested meanwhile."""
        deadline = time.monotonic() + delay_s
        while time.monotonic() < deadline:
            if (got := await self.next(deadline)) is None:
                return False
            agent_id, msg = got
            if isinstance(msg, INTERRUPTIONS):
                return True
            self.side_channel(agent_id, msg, None)
        return False
