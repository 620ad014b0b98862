"""The control plane's inbox as the supervise loop reads it, in every phase (agents starting, a
generation running, a teardown, a backoff): the next message within a deadline, and the side
channel, what is handled the same whatever the phase: chaos requests, `ftrun hosts`, agents
connecting and lost, agents' own errors.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ftrun.controller.chaos import ChaosDesk
from ftrun.controller.fleet import Fleet
from ftrun.controller.generation import GenWatch
from ftrun.controller.internal import InternalFailures
from ftrun.controller.patience import Patience
from ftrun.controller.server import ControlServer

# What ends a wait between generations early: a stop, or a preemption notice (supervisor.py's
# _interrupted tells them apart).
INTERRUPTIONS = ("stop_requested", "preempt_notice")

Message = tuple[str, dict[str, Any]]  # (sender, message)


class Inbox:
    def __init__(
        self, server: ControlServer, *, fleet: Fleet, chaos: ChaosDesk, internal: InternalFailures
    ) -> None:
        self.server = server
        self.fleet = fleet
        self.chaos = chaos
        self.internal = internal

    async def next(self, deadline: float | None) -> Message | None:
        """The next message; None once `deadline` (monotonic; None: no deadline) has passed."""
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return await asyncio.wait_for(self.server.inbox.get(), timeout)
        except asyncio.TimeoutError:
            return None

    def side_channel(self, sender: str, msg: dict[str, Any], watch: GenWatch | None) -> bool:
        """Chaos, `ftrun hosts`, agents (re)connecting: handled the same in every phase."""
        if self.chaos.handle(sender, msg, watch):
            return True
        if msg["kind"] == "agent_error":
            self.internal.on_agent_error(sender, msg)
            return True
        if msg["kind"] == "hosts" and sender in self.server.clients:
            ok, text = self.fleet.request(msg)
            self.server.send(sender, "hosts_ack", ok=ok, message=text)
            return True
        if msg["kind"] == "hello":
            return self.fleet.on_message(sender, msg)
        if msg["kind"] == "agent_lost" and (watch is None or sender not in watch.agents):
            self.fleet.on_lost(sender)
            return True
        self.fleet.on_message(sender, msg)  # a stopped agent's fresh port
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
            if msg["kind"] in INTERRUPTIONS:
                return False
            if msg["kind"] == "hello":
                self.fleet.on_message(agent_id, msg)
                waiting.discard(agent_id)
            elif msg["kind"] == "agent_lost":
                self.fleet.on_lost(agent_id)
                waiting.discard(agent_id)
            else:
                self.side_channel(agent_id, msg, None)
        return True

    async def agents_back(self, waiting: set[str], gen: int, timeout_s: float) -> set[str] | None:
        """Wait for the hello again of each agent in `waiting` (a resumed controller adopting
        generation `gen`); those that came back running it. None when a stop was requested."""
        deadline = time.monotonic() + timeout_s
        back: set[str] = set()
        held: list[tuple[str, dict[str, Any]]] = []  # what they said meanwhile: for the watch
        while waiting - back:
            if (got := await self.next(deadline)) is None:
                break
            agent_id, msg = got
            if msg["kind"] in INTERRUPTIONS:
                return None
            if msg["kind"] == "hello":
                self.fleet.on_message(agent_id, msg)
                if agent_id in waiting and msg.get("rejoin") and msg.get("gen") == gen:
                    back.add(agent_id)
                elif agent_id in waiting:
                    waiting.discard(agent_id)  # back, but its ranks are gone
            elif msg["kind"] == "agent_lost":
                waiting.discard(agent_id)
            elif not self.side_channel(agent_id, msg, None):
                held.append((agent_id, msg))
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
            if msg["kind"] in INTERRUPTIONS:
                return True
            self.side_channel(agent_id, msg, None)
        return False
