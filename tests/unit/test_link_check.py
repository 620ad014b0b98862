"""The link check between generations (controller/link_check.py's `before_join`), its choices
alone: which hosts the next plan would take that no check has seen, which checked peers they
are probed with, and that a restart on the same agents probes nothing. The probe itself runs on
the testbed (tests/integration/test_link_join.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ftrun.controller.job import JobMachine
from ftrun.controller.link_check import LinkCheck, _ring
from ftrun.controller.roster import Roster
from tests.unit.test_host_checks import Said
from tests.unit.test_job import Clock, machine


class Fleet:
    """What the link check asks of the fleet here: the roster and each host's agent."""

    def __init__(self, roster: Roster) -> None:
        self.roster = roster

    def agent_of(self, host: str) -> str | None:
        return self.roster.slots[host].agent_id


class Probes(LinkCheck):
    """The check with its probe recorded instead of run: each run leaves out `bad` hosts."""

    def __init__(self, job: JobMachine, said: Said, bad: set[str]) -> None:
        super().__init__(job.config, fleet=Fleet(job.roster), inbox=None, journal=job.journal,
                         reporter=said, excluded=job.excluded, leave_out=job.leave_out)  # fmt: skip
        self.bad = bad
        self.runs: list[tuple[list[str], list[str] | None, int | None]] = []

    async def run(
        self, hosts: list[str], *, joining: list[str] | None = None, planned: int | None = None
    ) -> bool:
        self.runs.append((hosts, joining, planned))
        for host in self.bad & set(hosts):
            self.leave_out(host, f"link check: {host} is slow with each of its peers")
        return True


def started(job: JobMachine, *hosts: str) -> None:
    for host in hosts:
        job.roster.ready(job.roster.new_agent(host))


def first_generation(tmp_path: Path, bad: frozenset[str] = frozenset(), **config: Any):
    """A 3-host job (4 wanted) with --link-check, its first check run and first plan made."""
    job = machine(tmp_path, Clock(), transport="ssh", link_check=True, max_nodes=4, **config)
    said = Said()
    check = Probes(job, said, set(bad))
    started(job, "node1", "node2", "node3")
    assert asyncio.run(check.before_first())
    assert job.first_plan() == ["node1", "node2", "node3"]
    ran = [job.roster.slots[h].agent_id for h in job.roster.active]
    return job, check, said, ran


def test_a_restart_on_the_same_agents_probes_nothing(tmp_path: Path) -> None:
    job, check, _, ran = first_generation(tmp_path)
    assert check.runs == [(["node1", "node2", "node3"], None, None)]  # the first check
    assert asyncio.run(check.before_join(ran))
    assert len(check.runs) == 1


def test_a_host_added_is_probed_with_two_checked_peers_and_joins(tmp_path: Path) -> None:
    job, check, _, ran = first_generation(tmp_path)
    job.roster.add("node4")
    started(job, "node4")
    assert asyncio.run(check.before_join(ran))
    assert check.runs[1:] == [(["node1", "node4", "node2"], ["node4"], 4)]
    assert job.plan("grow") == ["node1", "node2", "node3", "node4"]
    assert asyncio.run(check.before_join(ran))  # checked once: the next restart probes nothing
    assert len(check.runs) == 2


def test_a_bad_joiner_is_left_out_and_the_next_ready_host_probed(tmp_path: Path) -> None:
    job, check, _, ran = first_generation(tmp_path, bad={"node4"})
    for host in ("node4", "node5"):
        job.roster.add(host)
        started(job, host)
    assert asyncio.run(check.before_join(ran))
    # The plan takes node4 (4 wanted): probed, left out; then it would take node5: probed.
    assert [r[1] for r in check.runs[1:]] == [["node4"], ["node5"]]
    assert job.plan("grow") == ["node1", "node2", "node3", "node5"]


def test_a_lost_host_back_is_a_new_agent_and_is_probed(tmp_path: Path) -> None:
    job, check, _, ran = first_generation(tmp_path, min_nodes=2)
    job.roster.lost("node3")
    started(job, "node3")  # back, a fresh agent (node3#2)
    assert asyncio.run(check.before_join(ran))
    assert check.runs[1:] == [(["node1", "node3", "node2"], ["node3"], 3)]


def test_with_one_checked_peer_a_joiner_joins_unprobed_and_that_is_said(tmp_path: Path) -> None:
    job = machine(tmp_path, Clock(), transport="ssh", link_check=True, min_nodes=1)
    said = Said()
    check = Probes(job, said, set())
    started(job, "node1")
    assert asyncio.run(check.before_first())  # one host: nothing to check
    assert job.first_plan() == ["node1"]
    ran = [job.roster.slots["node1"].agent_id]
    started(job, "node2")
    assert asyncio.run(check.before_join(ran))
    assert check.runs == []
    assert any("node2 joins unprobed" in line for line in said.lines), said.lines


def test_off_without_the_flag(tmp_path: Path) -> None:
    job = machine(tmp_path, Clock(), transport="ssh", max_nodes=4)
    check = Probes(job, Said(), set())
    started(job, "node1", "node2", "node3")
    job.first_plan()
    job.roster.add("node4")
    started(job, "node4")
    assert asyncio.run(check.before_join([]))
    assert check.runs == []


def test_the_ring_puts_joiners_between_peers() -> None:
    assert _ring(["p1", "p2"], ["j1"]) == ["p1", "j1", "p2"]
    assert _ring(["p1", "p2"], ["j1", "j2", "j3"]) == ["p1", "j1", "p2", "j2", "j3"]
    assert _ring(["p1"], ["j1"]) == ["p1", "j1"]
    assert _ring([], ["j1", "j2", "j3"]) == ["j1", "j2", "j3"]
