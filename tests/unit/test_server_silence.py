"""The controller's silence rules with a real connection: a silent agent whose process is alive
is slow, not lost; a dead or remote one is lost; our own stall is not the agent's silence; and
heartbeat lateness is reported."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ftrun.controller.lateness import Histogram
from ftrun.controller.server import ControlServer
from ftrun.wire import protocol
from ftrun.wire.inbound import AgentLost, Hello

HB, LOST = 0.05, 0.3


class Agent:
    """A client that says hello and heartbeats until told to stop (or to go silent)."""

    def __init__(self, chan: protocol.Channel) -> None:
        self.chan = chan
        self.beating = True
        self.task = asyncio.create_task(self._beat())

    async def _beat(self) -> None:
        while True:
            if self.beating:
                self.chan.send("heartbeat")
            await asyncio.sleep(HB)


async def start(alive: dict[str, bool | None], stall_s: float = 0.0):
    events: list[tuple[str, dict[str, Any]]] = []
    server = ControlServer(
        protocol.new_secret(),
        expected_agents={"a#1"},
        heartbeat_interval_s=HB,
        host_lost_timeout_s=LOST,
        local_stall_timeout_s=stall_s,
        alive=lambda agent_id: alive.get(agent_id),
        on_event=lambda kind, **f: events.append((kind, f)),
    )
    port = await server.start()
    chan = await protocol.open_channel("127.0.0.1", port, server.secret, timeout_s=5)
    chan.send("hello", agent_id="a#1", host="a", pid=1)
    assert isinstance((await asyncio.wait_for(server.inbox.get(), 5))[1], Hello)
    return server, Agent(chan), events


async def lost_within(server: ControlServer, timeout_s: float) -> AgentLost | None:
    try:
        agent_id, msg = await asyncio.wait_for(server.inbox.get(), timeout_s)
    except asyncio.TimeoutError:
        return None
    assert agent_id == "a#1" and isinstance(msg, AgentLost)
    return msg


async def until(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_silent_but_alive_is_slow_then_recovers_then_is_lost_when_its_process_exits():
    async def scenario():
        alive = {"a#1": True}
        server, agent, events = await start(alive)
        agent.beating = False
        await until(lambda: any(k == "agent_slow" for k, _ in events))
        assert await lost_within(server, 3 * LOST) is None  # silent, alive: never lost
        agent.beating = True
        await until(lambda: any(k == "agent_recovered" for k, _ in events))
        [(_, recovered)] = [e for e in events if e[0] == "agent_recovered"]
        assert recovered["silent_s"] > 3 * LOST
        agent.beating = False
        await until(lambda: sum(k == "agent_slow" for k, _ in events) == 2)
        alive["a#1"] = False  # its process exited (the connection may linger: a stand-in)
        t0 = time.monotonic()
        msg = await lost_within(server, 2.0)
        assert msg is not None and "process exited" in msg.reason
        assert time.monotonic() - t0 < 0.5
        agent.task.cancel()
        await server.close()

    asyncio.run(scenario())


def test_remote_agent_is_lost_on_silence_and_a_local_one_after_the_stall_timeout():
    async def scenario():
        for liveness, stall_s, needle in (
            (None, 0.0, "no heartbeat"),
            (True, 0.6, "local stall timeout"),
        ):
            server, agent, events = await start({"a#1": liveness}, stall_s=stall_s)
            agent.beating = False
            t0 = time.monotonic()
            msg = await lost_within(server, 3.0)
            took = time.monotonic() - t0
            assert msg is not None and needle in msg.reason
            assert (stall_s or LOST) <= took + 0.06 < (stall_s or LOST) + 0.5
            agent.task.cancel()
            await server.close()

    asyncio.run(scenario())


def test_our_own_stall_is_not_the_agents_silence_and_lateness_is_reported():
    async def scenario():
        server, agent, events = await start({"a#1": None})  # remote: silence alone decides
        await until(lambda: server.lateness.heartbeats.n >= 3)
        # Block our own loop for longer than the lost timeout (a blocking call, a starved
        # process): the agent's heartbeats pile up in the socket buffer meanwhile.
        await asyncio.sleep(0)
        time.sleep(2 * LOST)
        assert await lost_within(server, 4 * LOST) is None
        assert server.lateness.deferred_checks >= 1
        assert any(k == "controller_stalled" for k, _ in events)
        agent.task.cancel()
        await server.close()  # reports the last period
        [stats] = [f for k, f in events if k == "heartbeat_stats"]
        assert stats["heartbeat_late"]["n"] >= 3 and stats["loop_lag"]["max_ms"] >= LOST * 1000
        assert stats["deferred_checks"] >= 1

    asyncio.run(scenario())


def test_histogram_percentiles():
    h = Histogram()
    assert h.percentile_ms(0.5) is None
    for ms in [1] * 98 + [40, 900]:
        h.add(ms / 1000)
    assert h.summary() == {
        "n": 100,
        "p50_ms": 1,
        "p99_ms": 40,
        "max_ms": 900.0,
        "hist": {"1": 98, "40": 1, "900": 1},
    }
    both = Histogram.merged([h.summary()["hist"], {"1": 100}])
    assert (both.n, both.percentile_ms(0.5), both.percentile_ms(0.995)) == (200, 1, 40)
    h.add(99.0)
    assert h.percentile_ms(1.0) == 5001
