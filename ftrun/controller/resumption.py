"""What a resumed controller does first (`ftrun resume`, or a requeued Slurm batch step).

It journals how the previous run ended: a controller that died is an incident of its own
(`controller-lost`, from the journal's last event to now), closed like any incident by the next
first step. And when the running generation can be adopted (adoption.py), it waits for that
generation's agents and takes it over, or lets them go and the job restarts from its freshest
checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ftrun.config import LaunchConfig
from ftrun.controller.adoption import Adoption
from ftrun.controller.fleet import Fleet
from ftrun.controller.generation import GenWatch
from ftrun.controller.inbox import Inbox
from ftrun.controller.incidents import Incidents
from ftrun.controller.reporting import Reporter
from ftrun.controller.requeue_note import BatchLoss
from ftrun.controller.stalldesk import StallDesk
from ftrun.errors import FtrunError
from ftrun.journal import Journal
from ftrun.journal.read import ResumePoint


class Interrupted(Exception):
    """A stop or a preemption notice came while the agents were awaited."""


class StoodDown(FtrunError):
    """A standby's takeover that most of the generation's agents did not come to: the primary
    still has them. Nothing was started; the standby stands down (exit 0)."""

    exit_code = 0


class Resumption:
    def __init__(
        self,
        config: LaunchConfig,
        *,
        journal: Journal,
        reporter: Reporter,
        incidents: Incidents,
        fleet: Fleet,
        inbox: Inbox,
        stalls: StallDesk,
        lead: Callable[[], None] = lambda: None,
    ) -> None:
        self.config = config
        self.lead = lead  # a takeover's term goes out to its agents (standby_desk.py)
        self.journal = journal
        self.reporter = reporter
        self.incidents = incidents
        self.fleet = fleet
        self.inbox = inbox
        self.stalls = stalls

    def journal_start(
        self,
        point: ResumePoint,
        *,
        adopting: bool,
        next_gen: int,
        batch_loss: BatchLoss | None = None,
        lost_at: float | None = None,
    ) -> None:
        """A job that ran before goes on. If its controller died (no `job_finished`), the
        outage is an incident; unless the running generation may be adopted, it ended.
        `batch_loss`: the Slurm batch node was lost with it, and an agent requeued the job.
        `lost_at`: a standby's takeover, when its agent took the primary for gone: the
        detection; the takeover is now (docs/standby.md)."""
        incident = point.open_incident
        if point.finished is None:
            incident = self.incidents.open()
            fault, reason = "controller-lost", "the controller died"
            if batch_loss is not None:
                fault = "batch-node-lost"
                reason = (
                    f"the batch node {batch_loss.batch_host} was lost, and the controller with "
                    f"it; the agent on {batch_loss.by} requeued the Slurm job"
                )
            self.journal.record(
                "fault_detected",
                incident=incident,
                gen=point.generation,
                fault=fault,
                host=batch_loss.batch_host if batch_loss else None,
                fault_t=point.last_t,
                detected_t=batch_loss.lost_t if batch_loss else lost_at or time.time(),
                taken_over_t=time.time() if lost_at is not None else None,
                step=point.last_step,
                reason=reason,
            )
            self.journal.record(
                "fault_classified",
                incident=incident,
                tier="restart-in-place",
                decision="restart",
                rule=fault,
                reason=f"{reason}; a new one goes on from the freshest checkpoint",
            )
            if batch_loss is not None:  # the requeue killed the old run's steps
                self.journal.record(
                    "torn_down",
                    incident=incident,
                    gen=point.generation,
                    torn_down_t=batch_loss.requeued_t,
                )
            if adopting:
                return  # adopted, or ended, once its agents are back or not (adopt)
            if point.running is not None:
                self.journal.record(
                    "generation_ended",
                    gen=point.running,
                    outcome="controller-lost",
                    step=point.last_step,
                )
        if incident is not None:
            # The next generation closes the incident that stopped the previous run.
            self.journal.record("resumed", incident=incident, next_gen=next_gen)

    async def adopt(self, adoption: Adoption, port: int, *, next_gen: int) -> GenWatch | None:
        """Wait for the running generation's agents: a GenWatch of it when all of them are
        back with it running, else None (they are told to fence, and the job goes on from the
        freshest checkpoint). Interrupted when a stop or a notice came meanwhile."""
        self.fleet.port = port
        self.fleet.expect_spares(adoption.spares)  # not waited for: only the generation is
        back = await self.inbox.agents_back(
            self.fleet.expect_back(adoption.agents), adoption.gen, adoption.wait_s
        )
        if back is None:
            raise Interrupted
        incident = self.incidents.count
        agents = [adoption.agents[h] for h in adoption.hosts]
        missing = [h for h, a in zip(adoption.hosts, agents, strict=True) if a not in back]
        if adoption.takeover and 2 * (len(agents) - len(missing)) <= len(agents):
            raise StoodDown(
                f"{len(agents) - len(missing)} of the {len(agents)} agents of generation "
                f"{adoption.gen} came to this standby: the primary controller still leads; "
                "standing down",
                hint="nothing was started or stopped",
            )
        self.lead()
        if not missing:
            self.fleet.roster.adopt(adoption.hosts)
            self.fleet.rendezvous.previous = agents  # where its ranks' snapshots are (peercopy)
            self.incidents.ever_progressed |= adoption.first_step_seen
            self.journal.record(
                "adopted", incident=incident, gen=adoption.gen, hosts=adoption.hosts
            )
            self.reporter.notice(
                f"adopted generation {adoption.gen} on {', '.join(adoption.hosts)}: its ranks "
                "trained on while there was no controller"
            )
            return GenWatch(
                adoption.gen,
                set(agents),
                dict(zip(agents, adoption.hosts, strict=True)),
                order=agents,
                stall=self.stalls.watch(set(agents)),
                journal=self.journal,
                reporter=self.reporter,
                nproc_per_node=self.config.nproc_per_node,
                adopted=True,
            )
        why = f"{', '.join(missing)} did not come back with generation {adoption.gen}"
        self.journal.record("adoption_failed", incident=incident, gen=adoption.gen, why=why)
        self.reporter.notice(f"cannot adopt: {why}; going on from the freshest checkpoint")
        self.fleet.release([*adoption.agents.values(), *adoption.spares.values()], why)
        self.journal.record(
            "generation_ended", gen=adoption.gen, outcome="controller-lost", step=None
        )
        self.journal.record("resumed", incident=incident, next_gen=next_gen)
        return None
