"""The controller's own deciding objects, built for a simulated job: the job machine (with its
roster, plan desk, incidents and quarantine) and each generation's watch. What differs from the
supervisor's (desks.py) is only what a simulation has not: a reporter (Quiet) and real time (the
clocks given, the simulator's)."""

from __future__ import annotations

from collections.abc import Callable

from ftrun.config import LaunchConfig
from ftrun.controller.generation import GenWatch
from ftrun.controller.host_health import HostHealth
from ftrun.controller.incidents import Incidents
from ftrun.controller.job import JobMachine
from ftrun.controller.planning import PlanDesk, Unplanned
from ftrun.controller.policy_file import FaultPolicy
from ftrun.controller.roster import Roster
from ftrun.controller.stall import StallWatch
from ftrun.journal import Journal
from ftrun.planner import Profile
from ftrun.sim.baseline import Baseline, DataParallelOnly
from ftrun.sim.quiet import Quiet


def job_machine(
    config: LaunchConfig,
    *,
    profile: Profile | None,
    baseline: Baseline | None,
    journal: Journal,
    now: Callable[[], float],
    wall: Callable[[], float],
) -> JobMachine:
    """The job machine with the default fault policy; the baseline plans DP only."""
    policy = FaultPolicy()
    health = HostHealth(policy.quarantine)
    desk = PlanDesk if baseline is None else DataParallelOnly
    plans: PlanDesk | Unplanned = (
        desk(config, profile, journal=journal, reporter=Quiet(), clock=now)
        if profile is not None
        else Unplanned(clock=now)
    )
    return JobMachine(
        config,
        policy=policy,
        roster=Roster(config.hosts, min_nodes=config.min_nodes, max_nodes=config.max_nodes),
        plans=plans,
        incidents=Incidents(config, rules=policy.rules, health=health, journal=journal),
        health=health,
        journal=journal,
        now=now,
        wall=wall,
    )


def generation_watch(
    number: int, agents: list[str], hosts: list[str], journal: Journal
) -> GenWatch:
    """A simulated generation's watch: its faults and steps are the simulator's to set."""
    return GenWatch(
        number,
        set(agents),
        dict(zip(agents, hosts, strict=True)),
        order=agents,
        stall=StallWatch(
            set(agents), exit_timeout_s=60.0, idle_timeout_s=0.0, stacks_timeout_s=10.0
        ),
        journal=journal,
        reporter=Quiet(),
    )
