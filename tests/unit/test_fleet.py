"""The fleet's bookkeeping around a transport: unreachable hosts, hello deadlines, removals.

The transport is a stand-in here (a pure unit seam: what the fleet does with the answers it
gets); the real ssh transport is exercised on the testbed in tests/integration/test_multihost.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from ftrun.config import LaunchConfig
from ftrun.controller.fleet import Fleet
from ftrun.controller.roster import HostState
from ftrun.controller.server import ControlServer
from ftrun.envcontract import forwarded
from ftrun.errors import FtrunError
from ftrun.journal import Journal
from ftrun.journal.read import read_events
from ftrun.wire.inbound import Hello, Hosts


class Handle:
    def __init__(self, host: str) -> None:
        self.host = host
        self.returncode = None
        self.terminated = False

    async def terminate(self, timeout_s: float) -> None:
        self.terminated = True


class StandInTransport:
    def __init__(self, unreachable: set[str] = frozenset(), delay_s: float = 0.0) -> None:
        self.unreachable = unreachable
        self.delay_s = delay_s
        self.handles: list[Handle] = []
        self.boots = []

    def bind_address(self) -> str:
        return "127.0.0.1"

    async def start_agent(self, boot, *, log) -> Handle:
        await asyncio.sleep(self.delay_s)
        if boot.host in self.unreachable:
            raise FtrunError(f"cannot reach {boot.host} over ssh: No route to host")
        self.boots.append(boot)
        self.handles.append(Handle(boot.host))
        return self.handles[-1]


class Notes:
    def __init__(self) -> None:
        self.notices: list[str] = []

    def notice(self, text: str, *, level: str = "info") -> None:
        self.notices.append(text)


def make_fleet(tmp_path: Path, transport, **overrides) -> Fleet:
    environ = {
        "PYTHONPATH": "/x",
        "PYTHONHOME": "/y",
        "CUDA_VISIBLE_DEVICES": "0",
        "NCCL_DEBUG": "INFO",
        "HOME": "/root",
    }
    options = dict(
        job_id="j-1",
        job_name="j",
        run_dir=tmp_path,
        script="t.py",
        transport="ssh",
        hosts=("a", "b", "c"),
        spares=("s",),
        agent_start_timeout_s=0.2,
        forward_env=tuple(forwarded(environ).items()),
    )
    options.update(overrides)
    config = LaunchConfig(**options)
    server = ControlServer(
        "secret", expected_agents=set(), heartbeat_interval_s=0.25, host_lost_timeout_s=1.0
    )
    return Fleet(
        config,
        transport=transport,
        server=server,
        journal=Journal(config.job_dir),
        reporter=Notes(),
        secret="secret",
    )


def hello(fleet: Fleet, host: str) -> None:
    agent_id = fleet.agent_of(host)
    assert agent_id is not None
    fleet.on_hello(agent_id, Hello(agent_id=agent_id, addr=f"10.0.0.{ord(host[0])}", port=4000))


def test_unreachable_host_is_journaled_lost_and_the_rest_start(tmp_path):
    async def scenario():
        transport = StandInTransport(unreachable={"b"})
        fleet = make_fleet(tmp_path, transport)
        started = await fleet.start_all(port=1234)
        assert sorted(fleet.roster.host_of(a) for a in started) == ["a", "c", "s"]
        assert fleet.roster.state("b") is HostState.LOST
        for host in ("a", "c", "s"):
            hello(fleet, host)
        assert fleet.roster.plan() == ["a", "c", "s"]
        await fleet.stop_all()
        return fleet, transport

    fleet, transport = asyncio.run(scenario())
    events = read_events(fleet.journal.job_dir)
    [event] = [e for e in events if e["kind"] == "host_unreachable"]
    assert event["host"] == "b" and "No route to host" in event["error"]
    assert all(h.terminated for h in transport.handles)
    # Forwarded: what ranks need everywhere; not what belongs to one host or interpreter.
    assert transport.boots[0].env == {"PYTHONPATH": "/x", "NCCL_DEBUG": "INFO"}


def test_an_agent_that_never_says_hello_makes_its_host_lost(tmp_path):
    async def scenario():
        fleet = make_fleet(tmp_path, StandInTransport())
        await fleet.start_all(port=1)
        for host in ("a", "b", "s"):
            hello(fleet, host)
        await asyncio.sleep(0.4)  # past agent_start_timeout_s: the deadline task has run
        state = fleet.roster.state("c")
        await fleet.stop_all()
        return state

    assert asyncio.run(scenario()) is HostState.LOST


def test_removals(tmp_path):
    async def scenario():
        transport = StandInTransport()
        fleet = make_fleet(tmp_path, transport, min_nodes=3)
        await fleet.start_all(port=1)
        for host in ("a", "b", "c", "s"):
            hello(fleet, host)
        fleet.roster.plan()
        spare = next(h for h in transport.handles if h.host == "s")
        ok, text = fleet.request(Hosts(action="remove", host="s"))
        assert ok and "removed s (ready)" in text
        await asyncio.sleep(0)
        assert spare.terminated  # not running ranks: stopped at once
        ok, text = fleet.request(Hosts(action="remove", host="c"))
        assert not ok and "fewer than --min-nodes 3" in text
        fleet.config = dataclasses.replace(fleet.config, min_nodes=2)
        ok, _ = fleet.request(Hosts(action="remove", host="c"))
        active = next(h for h in transport.handles if h.host == "c")
        await asyncio.sleep(0)
        assert ok and not active.terminated  # its ranks get the teardown's grace first
        assert fleet.roster.needs_replacing() == ["c"]
        fleet.release_removed()
        await asyncio.sleep(0)
        assert active.terminated
        assert fleet.request(Hosts(action="remove", host="c"))[0] is False
        await fleet.stop_all()

    asyncio.run(scenario())


def test_a_host_removed_while_its_agent_starts_gets_that_agent_stopped(tmp_path):
    async def scenario():
        transport = StandInTransport(delay_s=0.05)
        fleet = make_fleet(tmp_path, transport)
        starting = asyncio.ensure_future(fleet.start_all(port=1))
        await asyncio.sleep(0.01)
        assert fleet.request(Hosts(action="remove", host="b"))[0]
        started = await starting
        assert "b" not in {fleet.roster.host_of(a) for a in started}
        [handle] = [h for h in transport.handles if h.host == "b"]
        await asyncio.sleep(0)
        assert handle.terminated
        await fleet.stop_all()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "request_, message",
    [
        (Hosts(action="add", host="a"), "already part of the job"),
        (Hosts(action="frob", host="a"), "unknown hosts action"),
        (Hosts(action="add"), "name a host"),
    ],
)
def test_bad_hosts_requests(tmp_path, request_, message):
    async def scenario():
        fleet = make_fleet(tmp_path, StandInTransport())
        await fleet.start_all(port=1)
        ok, text = fleet.request(request_)
        await fleet.stop_all()
        return ok, text

    ok, text = asyncio.run(scenario())
    assert not ok and message in text


def test_adding_a_lost_host_tries_it_now_not_when_its_retry_comes_round(tmp_path):
    async def scenario():
        transport = StandInTransport(unreachable={"b"})
        fleet = make_fleet(tmp_path, transport)
        await fleet.start_all(port=1)
        assert fleet.roster.state("b") is HostState.LOST
        transport.unreachable.discard("b")  # the host is back (a spot node returned)
        ok, text = fleet.request(Hosts(action="add", host="b"))
        assert ok and "trying it again now" in text
        for _ in range(100):  # the start is spawned: a few loop turns, far below the 1 s retry
            if fleet.agent_of("b") is not None:
                break
            await asyncio.sleep(0.001)
        hello(fleet, "b")
        state = fleet.roster.state("b")
        await fleet.stop_all()
        return fleet, state

    fleet, state = asyncio.run(scenario())
    assert state is HostState.READY
    events = read_events(fleet.journal.job_dir)
    assert [e.get("was") for e in events if e["kind"] == "host_added"] == ["lost"]
