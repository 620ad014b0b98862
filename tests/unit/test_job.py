"""The job machine (ftrun/controller/job.py): the supervisor's decisions with no I/O, driven
alone on a clock of the test's, and through the simulator, which drives the same object. What
the simulator's copy of these decisions used to miss shows here: quarantine and back-off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ftrun.config import LaunchConfig
from ftrun.controller import evidence
from ftrun.controller.generation import Ending
from ftrun.controller.job import BackOff, End, JobMachine, Relaunch
from ftrun.controller.reporting import JobOutcome, OutcomeState
from ftrun.journal import Journal
from ftrun.journal.read import read_journal
from ftrun.sim.costs import DEFAULT_COSTS
from ftrun.sim.desks import generation_watch, job_machine
from ftrun.sim.run import FTRUN, simulate
from ftrun.sim.trace import parse_trace
from tests.decisions import decisions
from tests.unit.test_sim import SMALL_4, setup

HOSTS = ("node1", "node2", "node3")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def machine(tmp_path: Path, clock: Clock, **config: Any) -> JobMachine:
    cfg = LaunchConfig(job_id="job-1a2b3c", job_name="job", run_dir=tmp_path, script="x.py",
                       hosts=HOSTS, **config)  # fmt: skip
    journal = Journal(tmp_path / "job", clock=lambda: 1.8e9 + clock.t)
    return job_machine(cfg, profile=None, baseline=None, journal=journal, now=clock, wall=clock)


def lose(job: JobMachine, spec_hosts: list[str], host: str, step: int | None) -> Ending:
    """Generation `job.generation` on `spec_hosts` loses `host` at `step`: classified as
    judge.py does, and the Ending the supervisor would act on."""
    watch = generation_watch(job.generation, spec_hosts, spec_hosts, job.journal)
    watch.max_step = step
    watch.first_step_seen = step is not None
    job.roster.lost(host)
    failure = evidence.host_lost({"reason": "test"}, host, step)
    incident = job.incidents.open()
    decision = job.classify(watch, failure)
    return Ending("failed", False, incident, why=decision.reason, failure=failure)


def relaunch(job: JobMachine, end: Ending, hosts: list[str]) -> Relaunch | End:
    after = job.after(end)
    assert isinstance(after, BackOff)
    watch = generation_watch(job.generation, hosts, hosts, job.journal)
    return job.relaunch(end, watch, backoff_s=after.delay_s)


def test_faults_in_a_row_without_progress_back_off_and_a_host_failing_thrice_is_left_out(
    tmp_path: Path,
) -> None:
    clock = Clock()
    job = machine(tmp_path, clock, min_nodes=1, backoff_base_s=2.0, backoff_cap_s=5.0)
    for agent_host in HOSTS:
        job.roster.ready(job.roster.new_agent(agent_host))
    first = job.first_plan()
    assert first == list(HOSTS)
    spec = job.launch(first)
    assert (spec.number, spec.hosts, spec.restarts) == (1, list(HOSTS), 0)
    delays, plans = [], []
    hosts, step = first, 10
    for _ in range(3):  # node2 lost three times; only the first after progress
        end = lose(job, hosts, "node2", step)
        assert isinstance(job.after(end), BackOff)
        delays.append(job.after(end).delay_s)  # type: ignore[union-attr]
        decision = relaunch(job, end, hosts)
        assert isinstance(decision, Relaunch)
        plans.append(decision.hosts)
        job.launch(decision.hosts)
        job.roster.add("node2")  # it comes back each time, and the job grows onto it
        job.roster.ready(job.roster.new_agent("node2"))
        hosts = job.plan("grow")
        job.launch(hosts)
        step = None  # lost again before its first step
        clock.t += 10.0
    assert delays == [0.0, 2.0, 4.0]  # the first at once, then 2 s doubling (capped at 5)
    assert plans == [["node1", "node3"]] * 3
    assert hosts == ["node1", "node3"]  # the grow after the third loss: without node2
    events = read_journal(job.journal.job_dir).events
    quarantined = [e for e in events if e["kind"] == "host_quarantined" and "until_t" in e]
    assert [e["host"] for e in quarantined] == ["node2"]
    # Back and ready, node2 is neither planned nor grown onto while its quarantine lasts.
    assert "node2" not in job.plan("test")
    assert job.roster.can_grow(excluded=job.excluded()) == []
    clock.t += 3600.0
    assert "node2" in job.plan("test")  # expired
    restarts = [e for e in events if e["kind"] == "restart"]
    assert [e["backoff_s"] for e in restarts] == [0.0, 2.0, 4.0]
    assert [e["charged"] for e in restarts] == [False] * 3  # lost hosts: not the job's budget
    assert [e["how"] for e in events if e["kind"] == "hosts_changed"] == ["shrunk"] * 3
    assert job.launch(["node1"]).restarts == 3  # TORCHELASTIC_RESTART_COUNT counts them
    assert job.generation == 8


def test_the_job_ends_when_no_plan_fits_after_a_fault_and_as_the_judge_said_otherwise(
    tmp_path: Path,
) -> None:
    clock = Clock()
    job = machine(tmp_path, clock, min_nodes=3)
    for agent_host in HOSTS:
        job.roster.ready(job.roster.new_agent(agent_host))
    hosts = job.first_plan()
    assert isinstance(hosts, list)
    job.launch(hosts)
    end = lose(job, hosts, "node3", 5)
    decision = relaunch(job, end, hosts)
    assert isinstance(decision, End) and decision.outcome.state is OutcomeState.FAILED
    assert "node3" in str(decision.outcome.root_cause) and decision.notice is not None
    succeeded = JobOutcome.succeeded("every rank exited 0")
    assert job.after(Ending("succeeded", None, job=succeeded)) == End(succeeded)
    assert job.after(Ending("reconfigured", True, why="grow")) == BackOff(0.0)


def run_trace(tmp_path: Path, text: str) -> list[dict[str, Any]]:
    out = simulate(parse_trace(text), setup(), work_dir=tmp_path)
    job_dir = out[FTRUN].job_dir
    assert job_dir is not None
    return read_journal(job_dir).events


def test_a_simulated_host_lost_thrice_is_quarantined_and_not_grown_onto_again(
    tmp_path: Path,
) -> None:
    flaps = "".join(f"{t}000,remove,node2\n{t + 10}000,add,node2\n" for t in (30, 70, 110))
    events = run_trace(tmp_path, "0,add,node1\n0,add,node2\n0,add,node3\n" + flaps)
    launched = [e["hosts"] for e in events if e["kind"] == "generation_launched"]
    # Grown back onto node2 after its first two losses; after the third it is quarantined
    # (3 failures within 600 s) and the job stays on the other two.
    assert launched == [["node1", "node2", "node3"], ["node1", "node3"],
                        ["node1", "node3", "node2"], ["node1", "node3"],
                        ["node1", "node3", "node2"], ["node1", "node3"]]  # fmt: skip
    [benched] = [e for e in events if e["kind"] == "host_quarantined" and "until_t" in e]
    assert benched["host"] == "node2" and benched["failures"] == 3


def test_a_simulated_fault_before_the_first_step_of_a_relaunch_backs_off(tmp_path: Path) -> None:
    # node2 is lost while the generation that replaced node3 is still starting: no progress
    # in between, so the second restart waits the back-off base (1 s by default).
    c = DEFAULT_COSTS
    second = 60.0 + c.detect_s + c.teardown_s + 0.5
    assert 0.5 < c.relaunch_s + c.restore_s
    trace = "0,add,node1\n0,add,node2\n0,add,node3\n0,add,node4\n60000,remove,node3\n"
    events = run_trace(tmp_path, trace + f"{int(second * 1000)},remove,node2\n")
    assert [e["backoff_s"] for e in events if e["kind"] == "restart"] == [0.0, 1.0]
    launched = [e["t"] for e in events if e["kind"] == "generation_launched"]
    torn = [e["t"] for e in events if e["kind"] == "torn_down"]
    assert launched[2] - torn[1] == pytest.approx(1.0)


def test_a_simulated_jobs_decisions_are_each_kind_the_controller_journals(tmp_path: Path) -> None:
    # What the replay test compares between a real run and its simulation (tests/decisions.py):
    # here, that the simulation journals every kind of it, in the controller's order.
    events = run_trace(tmp_path, SMALL_4)
    assert decisions(events) == [
        ("launch", ("node1", "node2", "node3", "node4")),
        ("fault", "host-lost", "node3"),
        ("tier", "replace-node", "restart"),
        ("hosts", "shrunk", ("node3",), ()),
        ("restart", False, False),
        ("launch", ("node1", "node2", "node4")),
        ("reconfigure", "grow"),
        ("launch", ("node1", "node2", "node4", "node3")),
        ("fault", "host-lost", "node2"),
        ("tier", "replace-node", "restart"),
        ("hosts", "shrunk", ("node2",), ()),
        ("restart", False, False),
        ("launch", ("node1", "node4", "node3")),
        ("reconfigure", "grow"),
        ("launch", ("node1", "node4", "node3", "node5")),
    ]


def test_a_straggler_is_replaced_or_dropped_only_when_that_pays_for_the_restart(
    tmp_path: Path,
) -> None:
    clock = Clock()
    told: list[tuple[str, float, str, int]] = []
    hosts = ["node1", "node2", "node3"]

    def job_with(policy: str, **config: Any) -> JobMachine:
        place = tmp_path / f"{policy}-{len(list(tmp_path.iterdir()))}"
        place.mkdir()
        job = machine(place, clock, stragglers=policy, **config)
        job.quarantined = lambda *a: told.append(a)
        for host in HOSTS:
            job.roster.ready(job.roster.new_agent(host))
        job.launch(job.first_plan())  # type: ignore[arg-type]
        clock.t += 8.0  # launched → first step: 8 s; torn down in 2 s
        job.plans.first_step()
        job.plans.torn_down(2.0)
        return job

    assert job_with("report").on_straggler("node3", 2.0, hosts) is None
    # replace: no spare ready (every host runs ranks) → kept, and why.
    job = job_with("replace")
    assert job.on_straggler("node3", 2.0, hosts) is None
    job.roster.add("node4")
    job.roster.ready(job.roster.new_agent("node4"))
    change = job.on_straggler("node3", 2.0, hosts)
    assert change is not None and change.why == "straggler"
    assert "node3 is a straggler (2.0x): replaced by a spare, saving 900 s" in change.detail
    assert "restart of 10 s" in change.detail
    assert [t[0] for t in told] == ["node3"]  # quarantined, kept in the user's store
    assert job.plan("straggler") == ["node1", "node2", "node4"]
    # drop: one host fewer for the others to carry; 1.2x slower is then no gain at all.
    job = job_with("drop")
    assert job.on_straggler("node3", 1.2, hosts) is None
    assert job.on_straggler("node3", 3.0, hosts) is not None  # 2x on two hosts: pays
    assert job.plan("straggler") == ["node1", "node2"]
    # A short horizon does not pay a 10 s restart back.
    job = job_with("drop", replan_horizon_s=15.0)
    assert job.on_straggler("node3", 3.0, hosts) is None
    kept = [e["reason"] for e in read_journal(job.journal.job_dir).events
            if e["kind"] == "straggler_kept"]  # fmt: skip
    assert kept == [
        "8 s saved over --replan-horizon 15 s does not pay a restart of 10 s"
    ]  # 15 x (1 - 1/2)
