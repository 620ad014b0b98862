"""Output that survives a controller change, with real connections: the agent's link
(agent/link.py, agent/unacked.py) and the controller's server and inbox (controller/server.py,
inbox.py, output_acks.py) over TCP on loopback. A controller that dies before it wrote what it
received is replaced by a new one on the same address (as `ftrun resume` does): the agent sends
it again what was not acknowledged, in order, before anything new. The same controller after a
blip drops what it already has."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ftrun.agent.link import ControlLink
from ftrun.agent.unacked import UnackedRing
from ftrun.bootstrap import Bootstrap
from ftrun.controller.inbox import Inbox
from ftrun.controller.output_acks import OutputAcks
from ftrun.controller.server import ControlServer
from ftrun.netutil import free_port
from ftrun.wire import protocol
from ftrun.wire.inbound import Hello, Log

HB = 0.05
AGENT = "a#1"


def test_the_ledger_drops_what_it_received_and_acks_what_was_handled():
    acks = OutputAcks()
    acks.hello(AGENT, pid=10, rejoin=False)
    assert [acks.fresh(AGENT, n) for n in (1, 2, 2, 1, 3)] == [True, True, False, False, True]
    assert acks.duplicates == 2 and acks.acked(AGENT) is None
    acks.settled(AGENT, 2)
    assert acks.acked(AGENT) == 2
    acks.hello(AGENT, pid=10, rejoin=True)  # the same process again: its numbers go on
    assert not acks.fresh(AGENT, 3) and acks.acked(AGENT) == 2
    acks.hello(AGENT, pid=11, rejoin=True)  # another process: numbers start again
    assert acks.fresh(AGENT, 1) and acks.acked(AGENT) is None
    acks.hello(AGENT, pid=11, rejoin=False)
    assert acks.fresh(AGENT, 1)


async def until(predicate, timeout_s: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def controller(secret: str, port: int) -> tuple[ControlServer, Inbox]:
    server = ControlServer(
        secret, expected_agents={AGENT}, heartbeat_interval_s=HB, host_lost_timeout_s=5.0
    )
    await server.start("127.0.0.1", port)
    # Only next() is used here: the inbox's side channel is not (no fleet, chaos, ...).
    return server, Inbox(server, fleet=None, chaos=None, internal=None)  # type: ignore[arg-type]


async def take_logs(inbox: Inbox, written: list[str], stop: asyncio.Event) -> None:
    """The supervise loop's part: take each message, write a log's lines."""
    while not stop.is_set():
        got = await inbox.next(time.monotonic() + 0.05)
        if got is not None and isinstance(got[1], Log):
            written.extend(got[1].lines)


class Agent:
    def __init__(self, port: int, secret: str) -> None:
        boot = Bootstrap(
            controller_host="127.0.0.1",
            controller_port=port,
            secret=secret,
            job_id="j",
            agent_id=AGENT,
            host="a",
            heartbeat_interval_s=HB,
            fence_timeout_s=2.0,
            warm_start=False,
            controller_grace_s=30.0,
        )
        self.fenced: list[str] = []
        self.link = ControlLink(boot, fence=self.fenced.append, generation=lambda: 1)
        self.tasks: list[asyncio.Task[Any]] = []

    async def start(self) -> None:
        await self.link.open(port=free_port("127.0.0.1"))
        self.tasks = [
            asyncio.create_task(self._receive()),
            asyncio.create_task(self.link.heartbeat_loop(lambda: 1)),
        ]

    async def _receive(self) -> None:
        while await self.link.receive() is not None:
            pass

    def say(self, *lines: str) -> None:
        for line in lines:
            self.link.send("log", gen=1, rank=0, lines=[line])

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.link.close()


def test_what_a_dead_controller_never_wrote_reaches_the_next_one_in_order():
    async def scenario() -> None:
        secret, port = protocol.new_secret(), free_port("127.0.0.1")
        first, first_inbox = await controller(secret, port)
        agent = Agent(port, secret)
        await agent.start()
        written: list[str] = []
        stop = asyncio.Event()
        reader = asyncio.create_task(take_logs(first_inbox, written, stop))
        agent.say("1", "2", "3")
        await until(lambda: not len(agent.link.unacked), what="the acks of 1..3")
        assert written == ["1", "2", "3"]
        stop.set()
        await reader
        # The controller takes 4 and 5 in but dies before it writes them.
        agent.say("4", "5")
        await until(lambda: first.inbox.qsize() >= 2, what="4 and 5 received")
        await first.close()
        await until(lambda: agent.link.rejoining or agent.link.chan is None, what="the loss")
        agent.say("6")  # said while there is no controller
        second, second_inbox = await controller(secret, port)
        stop = asyncio.Event()
        reader = asyncio.create_task(take_logs(second_inbox, written, stop))
        await until(lambda: not agent.link.rejoining and agent.link.chan is not None, what="rejoin")
        agent.say("7")
        await until(lambda: written[-1:] == ["7"], what="7 written")
        assert written == [str(n) for n in range(1, 8)]  # none lost, none twice, in order
        await until(lambda: not len(agent.link.unacked), what="the acks of 4..7")
        assert agent.link.unacked.acked == 7 and not agent.fenced
        stop.set()
        await reader
        await agent.close()
        await second.close()

    asyncio.run(scenario())


def test_the_same_controller_after_a_blip_drops_what_it_already_has():
    async def scenario() -> None:
        secret, port = protocol.new_secret(), free_port("127.0.0.1")
        server, inbox = await controller(secret, port)
        agent = Agent(port, secret)
        await agent.start()
        agent.say("1", "2")
        await until(lambda: server.inbox.qsize() >= 3, what="hello, 1 and 2 received")
        # Not yet written, so not acknowledged: the blip makes the agent send them again.
        agent.link.chan.abort()  # type: ignore[union-attr]
        await until(lambda: server.inbox.qsize() >= 5, what="the loss and the hello again")
        agent.say("3")
        got: list[Any] = []
        while not any(isinstance(m, Log) and m.lines == ["3"] for m in got):
            got.append((await asyncio.wait_for(server.inbox.get(), 10))[1])
        logs = [m.lines[0] for m in got if isinstance(m, Log)]
        assert logs == ["1", "2", "3"], got  # 1 and 2 sent again, dropped as duplicates
        assert server.output_acks.duplicates == 2
        assert sum(isinstance(m, Hello) for m in got) == 2
        del inbox
        await agent.close()
        await server.close()

    asyncio.run(scenario())


def test_a_ring_that_overflowed_says_so_to_the_next_controller():
    async def scenario() -> None:
        secret, port = protocol.new_secret(), free_port("127.0.0.1")
        first, _ = await controller(secret, port)
        agent = Agent(port, secret)
        agent.link.unacked = UnackedRing(max_messages=2)
        await agent.start()
        await first.close()  # nothing acknowledged, and no controller for a while
        await until(lambda: agent.link.rejoining or agent.link.chan is None, what="the loss")
        agent.say("1", "2", "3", "4", "5")
        second, second_inbox = await controller(secret, port)
        written: list[str] = []
        stop = asyncio.Event()
        reader = asyncio.create_task(take_logs(second_inbox, written, stop))
        await until(lambda: len(written) >= 3, what="the ring and the note")
        assert written[:2] == ["4", "5"], written  # the oldest went
        assert "3 output messages of a were dropped" in written[2], written
        stop.set()
        await reader
        await agent.close()
        await second.close()

    asyncio.run(scenario())
