"""The checks of each host before it runs ranks (controller/host_checks.py): versions against
the job's (most hosts'), a clock against this machine's; and what an agent says of its host."""

from __future__ import annotations

from pathlib import Path

from ftrun.agent.host_facts import facts
from ftrun.controller.host_checks import HostChecks
from ftrun.journal import Journal
from ftrun.journal.read import read_journal
from ftrun.wire.inbound import Hello
from tests.unit.test_job import Clock, machine


class Said:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def notice(self, text: str, level: str = "info") -> None:
        self.lines.append(text)


def hello(host: str, python: str = "3.12.3", torch: str | None = "2.13.0", wall_t: float = 100.0):
    return Hello(agent_id=f"{host}#0", host=host, python=python, torch=torch, wall_t=wall_t)


def test_a_host_with_other_versions_is_left_out_and_let_in_once_fixed(tmp_path: Path) -> None:
    clock, said = Clock(), Said()
    job = machine(tmp_path, clock)
    checks = HostChecks(journal=job.journal, reporter=said, leave_out=job.leave_out,
                        let_in=job.let_in, wall=lambda: 100.0)  # fmt: skip
    for host in ("node1", "node2", "node3"):
        job.roster.ready(job.roster.new_agent(host))
    checks.heard("node1", hello("node1", torch="2.12.0"))  # the odd one first: not the job's
    checks.heard("node2", hello("node2"))
    checks.heard("node3", hello("node3", python="3.12.7"))  # a patch release: the same
    checks.settle()
    assert job.first_plan() == ["node2", "node3"]
    assert said.lines == [
        "node1 has Python 3.12, torch 2.12.0; the job's other hosts have Python 3.12, torch "
        "2.13.0: left out. Install the same versions there, then `ftrun hosts JOB add node1`"
    ]
    checks.heard("node1", hello("node1"))  # fixed, its agent back
    assert "node1" in job.plan("test")
    events = read_journal(job.journal.job_dir).events
    assert [e["kind"] for e in events if e.get("host") == "node1"] == [
        "host_left_out",
        "host_released",
    ]


def test_a_clock_off_by_more_than_two_seconds_is_said_once(tmp_path: Path) -> None:
    said = Said()
    journal = Journal(tmp_path / "job")
    checks = HostChecks(journal=journal, reporter=said, leave_out=lambda h, w: None,
                        let_in=lambda h: None, wall=lambda: 100.0)  # fmt: skip
    checks.heard("node1", hello("node1", wall_t=101.5))
    checks.heard("node2", hello("node2", wall_t=95.0))
    checks.heard("node2", hello("node2", wall_t=95.0))
    assert said.lines == [
        "node2's clock is 5.0 s behind this machine's: the times its agent reports are off by "
        "as much (run NTP or chrony there)"
    ]


def test_an_agent_says_what_its_ranks_run() -> None:
    import torch

    said = facts()
    assert said["torch"] == torch.__version__.split("+")[0] or said["torch"] == torch.__version__
    assert said["python"].count(".") == 2 and isinstance(said["wall_t"], float)
