"""One generation watched until something ends it: its agents' messages, and its waiters.

What a message means is the generation's (GenWatch.on_message), the stall desk's or the side
channel's (inbox.py: chaos, `ftrun hosts`, agents coming and going); what the watch waits on
beside them is a list of waiters (waiters.py). What ends the watch is returned to the
Supervisor, which judges it (judge.py) and tears the generation down.
"""

from __future__ import annotations

import dataclasses
import time

from ftrun.config import LaunchConfig
from ftrun.controller import evidence
from ftrun.controller.fleet import Fleet
from ftrun.controller.generation import GenWatch, Reconfigure, Seen, WatchResult
from ftrun.controller.inbox import Inbox
from ftrun.controller.internal import InternalFailures
from ftrun.controller.job import JobMachine
from ftrun.controller.job_signals import JobSignals
from ftrun.controller.pace import StragglerWatch
from ftrun.controller.persist_first import PersistFirst
from ftrun.controller.planning import PlanDesk, Unplanned
from ftrun.controller.preemption import PreemptWait, under
from ftrun.controller.reporting import OutcomeState, Reporter
from ftrun.controller.server import ControlServer
from ftrun.controller.stalldesk import StallDesk
from ftrun.controller.waiters import FirstStepPatience, StallWaiter, Waiter, earliest
from ftrun.journal import Journal
from ftrun.wire.inbound import AgentLost, PreemptNotice, Report, StopRequested


class Watcher:
    def __init__(
        self,
        config: LaunchConfig,
        *,
        server: ControlServer,
        inbox: Inbox,
        fleet: Fleet,
        stalls: StallDesk,
        signals: JobSignals,
        plans: PlanDesk | Unplanned,
        job: JobMachine,
        internal: InternalFailures,
        journal: Journal,
        reporter: Reporter,
    ) -> None:
        self.config = config
        self.server, self.inbox, self.fleet, self.stalls = server, inbox, fleet, stalls
        self.signals, self.plans, self.job, self.internal = signals, plans, job, internal
        self.roster = fleet.roster
        self.journal, self.reporter = journal, reporter

    async def watch(self, watch: GenWatch) -> WatchResult:
        """Until something ends the generation: its messages, and its waiters (waiters.py)."""
        preempt = self._preempt_wait(watch) if self.signals.preempt_pending else None
        grow: PersistFirst | None = None  # a grow waiting for its persist (persist_first.py)
        waiters: list[Waiter] = [
            FirstStepPatience(self.reporter, watch, first_s=10.0),
            StallWaiter(self.stalls, watch),
            StragglerWatch(
                watch.number,
                watch.hosts,
                nproc_per_node=self.config.nproc_per_node,
                journal=self.journal,
                reporter=self.reporter,
                decide=self.job.on_straggler,
            ),
            *([preempt] if preempt is not None else []),
        ]
        while True:
            now = time.monotonic()
            for waiter in waiters:
                if (ended := waiter.expired(now)) is not None:
                    return under(preempt, ended)
            if (got := await self.inbox.next(earliest(waiters))) is None:
                continue
            agent_id, msg = got
            match msg:
                case StopRequested():
                    return OutcomeState.STOPPED
                case PreemptNotice():
                    if preempt is None:  # ahead of a grow's persist: see waiters.py
                        preempt = self._preempt_wait(watch)
                        waiters.insert(3, preempt)
                    continue
                case AgentLost() if agent_id in watch.agents:
                    if (ended := self._lost(watch, agent_id, msg)) is not None:
                        return under(preempt, ended)
                    continue
            if self.inbox.side_channel(agent_id, msg, watch):
                if grow is None and (change := self._reconfiguration(watch)) is not None:
                    grow = self._persist_first(watch, change, preempt)
                    if grow is None:
                        return under(preempt, change)  # a host was added or removed
                    waiters.append(grow)
                continue
            if not isinstance(msg, Report) or msg.gen != watch.number:
                continue  # stale: from an older generation (or no report of one)
            if (why := watch.forged(agent_id, msg)) is not None:
                self.server.refuse(agent_id, msg, why)
                continue
            for waiter in waiters:
                if (ended := waiter.on_message(agent_id, msg)) is not None:
                    return under(preempt, ended)
            stepped = watch.first_step_seen
            news = watch.on_message(agent_id, msg)
            if news is None:
                self.stalls.news(watch, agent_id, msg)
                if watch.every_rank_exited_0():
                    return under(preempt, OutcomeState.SUCCEEDED)
            elif news is Seen.PROGRESS:
                if not stepped:
                    self.plans.first_step()
                if grow is None and (change := self._reconfiguration(watch)) is not None:
                    grow = self._persist_first(watch, change, preempt)
                    if grow is None:
                        return under(preempt, change)
                    waiters.append(grow)
            elif news is not Seen.OUTPUT:
                return under(preempt, news)

    def _lost(self, watch: GenWatch, agent_id: str, msg: AgentLost) -> WatchResult | None:
        """A host of the generation lost: a failure, unless its ranks had all exited 0 (then
        nothing was lost, and the job may have just succeeded)."""
        msg = dataclasses.replace(msg, reason=self.internal.lost_reason(agent_id, msg.reason))
        host = self.fleet.on_lost(agent_id) or watch.hosts[agent_id]
        if not watch.finished_on(agent_id):
            return evidence.host_lost(msg, host, watch.max_step)
        self.journal.record(
            "host_lost_after_finishing", gen=watch.number, host=host, reason=msg.reason
        )
        self.reporter.notice(f"{host} was lost after every rank on it exited 0: nothing to redo")
        return OutcomeState.SUCCEEDED if watch.agent_done(agent_id) else None

    def _reconfiguration(self, watch: GenWatch) -> Reconfigure | None:
        """A host removed, or ready hosts to grow onto that pay for the restart: the job
        machine's decision (job.py)."""
        return self.job.reconfiguration(watch)

    def _persist_first(
        self, watch: GenWatch, change: Reconfigure, preempt: PreemptWait | None
    ) -> PersistFirst | None:
        """A grow of a generation that checkpoints with ftrun.checkpoint (rank 0 reported a
        stall) waits for a persist of its newest step first; None: the change goes ahead now
        (a removal restores from the survivors' memory; a notice has its own persist)."""
        if change.why != "grow" or preempt is not None or watch.stall_s is None:
            return None
        return PersistFirst(
            change, server=self.server, journal=self.journal, gen=watch.number, step=watch.max_step
        )

    def _preempt_wait(self, watch: GenWatch) -> PreemptWait:
        signal, self.signals.preempt_pending = self.signals.preempt_pending, None
        return PreemptWait(
            self.config,
            server=self.server,
            journal=self.journal,
            reporter=self.reporter,
            gen=watch.number,
            step=watch.max_step,
            signal=signal or self.config.preempt_signal,
            since=self.signals.preempt_at,
        )
