"""The desks a Supervisor runs a job with, each built once and wired to the others it needs.

Each desk owns one concern: the control server, the agents (fleet.py), incidents and the fault
policy, quarantine, the side channel (inbox.py), stalls, the judge, the one teardown path, the
job's signals, the plan, a resumed job's start and a generation's watch. Wiring them here says
in one place what talks to what, and keeps supervisor.py the supervise loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ftrun.config import LaunchConfig
from ftrun.controller.chaos import ChaosDesk
from ftrun.controller.fleet import Fleet
from ftrun.controller.host_checks import HostChecks
from ftrun.controller.host_health import HostHealth
from ftrun.controller.inbox import Inbox
from ftrun.controller.incidents import Incidents
from ftrun.controller.internal import InternalFailures
from ftrun.controller.job import JobMachine
from ftrun.controller.job_signals import JobSignals
from ftrun.controller.judge import Judge
from ftrun.controller.link_check import LinkCheck
from ftrun.controller.planning import PlanDesk, Unplanned, plan_desk
from ftrun.controller.policy_file import FaultPolicy
from ftrun.controller.quarantine_desk import QuarantineDesk
from ftrun.controller.reporting import Reporter
from ftrun.controller.resumption import Resumption
from ftrun.controller.server import ControlServer
from ftrun.controller.stalldesk import StallDesk
from ftrun.controller.standby_desk import StandbyDesk
from ftrun.controller.teardown import Teardown
from ftrun.controller.watcher import Watcher
from ftrun.journal import Journal
from ftrun.quarantine import QuarantineStore
from ftrun.transport.base import Transport


@dataclasses.dataclass(frozen=True, kw_only=True)
class Desks:
    """One job's desks (the hosts' roster is the fleet's: fleet.roster)."""

    internal: InternalFailures
    server: ControlServer
    fleet: Fleet
    health: HostHealth
    incidents: Incidents
    inbox: Inbox
    stalls: StallDesk
    judge: Judge
    teardown: Teardown
    signals: JobSignals
    plans: PlanDesk | Unplanned
    job: JobMachine
    quarantine: QuarantineDesk
    checks: HostChecks
    links: LinkCheck
    standby: StandbyDesk
    resumption: Resumption
    watcher: Watcher


def wire_desks(
    config: LaunchConfig,
    *,
    policy: FaultPolicy,
    journal: Journal,
    transport: Transport,
    reporter: Reporter,
    secret: str,
    generation: Callable[[], int],
) -> Desks:
    """The desks for one job. `generation`: the running generation's number, which the
    Supervisor keeps (a failure or a signal is journaled with it)."""
    internal = InternalFailures(journal, reporter, generation=generation)
    server = ControlServer(
        secret,
        expected_agents=set(),
        heartbeat_interval_s=config.heartbeat_interval_s,
        host_lost_timeout_s=config.host_lost_timeout_s,
        local_stall_timeout_s=config.local_stall_timeout_s,
        alive=lambda agent_id: fleet.agent_alive(agent_id),
        on_event=journal.record,
        tasks=internal.tasks,
    )
    fleet = Fleet(
        config,
        transport=transport,
        server=server,
        journal=journal,
        reporter=reporter,
        secret=secret,
        tasks=internal.tasks,
    )
    health = HostHealth(policy.quarantine)
    incidents = Incidents(config, rules=policy.rules, health=health, journal=journal)
    plans = plan_desk(config, journal=journal, reporter=reporter)
    quarantine = QuarantineDesk(config, store=QuarantineStore(), reporter=reporter)
    job = JobMachine(
        config,
        policy=policy,
        roster=fleet.roster,
        plans=plans,
        incidents=incidents,
        health=health,
        journal=journal,
        quarantined=quarantine.keep,
    )
    checks = HostChecks(
        journal=journal, reporter=reporter, leave_out=job.leave_out, let_in=job.let_in
    )
    fleet.hello_checks = checks.heard
    standby = StandbyDesk(config, server=server, journal=journal)
    fleet.hello_standby = standby.heard
    inbox = Inbox(
        server,
        fleet=fleet,
        internal=internal,
        chaos=ChaosDesk(server, journal, nproc_per_node=config.nproc_per_node),
        host_added=job.unbench,
        standby_ready=standby.ready,
    )
    stalls = StallDesk(config, server=server, journal=journal, confirm_s=policy.hang.confirm_s)
    judge = Judge(job=job, stalls=stalls, journal=journal, reporter=reporter)
    teardown = Teardown(
        config,
        server=server,
        inbox=inbox,
        fleet=fleet,
        internal=internal,
        journal=journal,
        reporter=reporter,
    )
    signals = JobSignals(
        config, server=server, journal=journal, reporter=reporter, generation=generation
    )
    fleet.agents.superseded = signals.superseded
    return Desks(
        internal=internal,
        server=server,
        fleet=fleet,
        health=health,
        incidents=incidents,
        inbox=inbox,
        stalls=stalls,
        judge=judge,
        teardown=teardown,
        signals=signals,
        plans=plans,
        job=job,
        quarantine=quarantine,
        checks=checks,
        standby=standby,
        links=LinkCheck(
            config,
            fleet=fleet,
            inbox=inbox,
            journal=journal,
            reporter=reporter,
            excluded=job.excluded,
            leave_out=job.leave_out,
        ),
        resumption=Resumption(
            config,
            journal=journal,
            reporter=reporter,
            incidents=incidents,
            fleet=fleet,
            inbox=inbox,
            stalls=stalls,
            lead=standby.lead,
        ),
        watcher=Watcher(
            config,
            server=server,
            inbox=inbox,
            fleet=fleet,
            stalls=stalls,
            signals=signals,
            plans=plans,
            job=job,
            internal=internal,
            journal=journal,
            reporter=reporter,
        ),
    )
