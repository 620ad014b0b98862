"""The supervise loop: launch a generation, watch it, classify what went wrong, act, repeat.

    start agents ─▶ launch G ─▶ watch ─┬─ all hosts exited 0 ───────────────▶ succeeded
                      ▲                ├─ a rank exited 0, others hung ─▶ kill ▶ succeeded
                      │                │     (exit barrier, stall.py; an exit_hang incident)
                      │                ├─ Ctrl-C / SIGTERM ─▶ graceful stop ─▶ stopped
                      │                └─ fault ─▶ classify ─▶ tear down (SIGKILL: it is broken)
                      │                              ├─ fatal / no replacement ──▶ failed
                      └──── backoff ◀────────────────┘ restart in place (G+1)

Whatever ends a watch is judged first (journaled, classified: an `Ending`, judge.py's); then the
generation goes down the one teardown path, and only then does the job end or the next
generation start.
The desks the loop runs the job with are built and wired to each other by desks.py.
What agents' messages mean is the generation's (generation.py), the stall desk's (stalldesk.py)
or the side channel's (chaos, `ftrun hosts`, agents coming and going); quarantine is
host_health.py's; the one teardown path is teardown.py's; Ctrl-C, SIGTERM and forwarded
signals are job_signals.py's.

Every decision is an event in the journal; `status` and `inspect` read nothing else. So is every
failure of the job's own machinery (internal.py): a controller or agent task that fails is
restarted or ends the job with it as the root cause, never a controller that silently stops.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time

import psutil

from ftrun import tls
from ftrun.config import LaunchConfig
from ftrun.controller import requeue_note
from ftrun.controller.adoption import CONTROL_FILE, Adoption, save_identity
from ftrun.controller.desks import wire_desks
from ftrun.controller.generation import Ending, GenWatch
from ftrun.controller.job import End, LaunchSpec, Relaunch
from ftrun.controller.policy_file import FaultPolicy
from ftrun.controller.reporting import JobOutcome, Reporter
from ftrun.controller.requeue_note import BatchLoss
from ftrun.controller.resumption import Interrupted, StoodDown
from ftrun.errors import FtrunError
from ftrun.journal import Journal
from ftrun.journal.read import ResumePoint
from ftrun.tasks import TaskFailure
from ftrun.transport.base import Transport
from ftrun.transport.options import SlurmOptions
from ftrun.transport.registry import options_of
from ftrun.wire.protocol import new_secret


class Supervisor:
    def __init__(
        self,
        config: LaunchConfig,
        *,
        policy: FaultPolicy,
        journal: Journal,
        transport: Transport,
        reporter: Reporter,
        resume: ResumePoint | None = None,
        adoption: Adoption | None = None,
    ) -> None:
        self.config = config
        self.resume = resume
        self.adoption = adoption
        self.policy = policy
        self.journal = journal
        self.transport = transport
        self.reporter = reporter
        # A resumed controller that may adopt the running generation is found by its agents as
        # the old one was: its secret, port and certificate (adoption.py).
        self.secret = adoption.secret if adoption is not None else new_secret()
        desks = wire_desks(
            config,
            policy=policy,
            journal=journal,
            transport=transport,
            reporter=reporter,
            secret=self.secret,
            generation=lambda: self.generation,
        )
        self.internal, self.server, self.fleet = desks.internal, desks.server, desks.fleet
        self.roster, self.health, self.incidents = self.fleet.roster, desks.health, desks.incidents
        self.inbox, self.stalls, self.judge = desks.inbox, desks.stalls, desks.judge
        self.teardown, self.signals, self.plans = desks.teardown, desks.signals, desks.plans
        self.resumption, self.watcher = desks.resumption, desks.watcher
        self.job, self.quarantine, self.checks = desks.job, desks.quarantine, desks.checks
        self.links, self.standby = desks.links, desks.standby
        if resume is not None:  # a requeued job goes on where its journal left off
            self.job.generation = resume.generation
            self.incidents.count = resume.incidents
            self.incidents.restarts = resume.restarts
            self.incidents.replacements = resume.replacements

    @property
    def generation(self) -> int:
        """The last generation launched (the job machine's count)."""
        return self.job.generation

    # ---- top level --------------------------------------------------------------------------

    async def run(self) -> JobOutcome:
        cfg = self.config
        bind = self.transport.bind_address()
        # Agents on other hosts talk to us over the network: encrypted (tls.py), unless the user
        # said --insecure-plain-control. Loopback: plain.
        encrypted = bind != "127.0.0.1" and self.config.control_tls
        identity = None
        if encrypted:
            adopted = self.adoption.identity if self.adoption is not None else None
            identity = adopted or tls.new_identity()
            save_identity(self.journal.files, identity)
        context = tls.server_context(identity, self.journal.job_dir) if identity else None
        port = await self._listen(bind, context)
        self.fleet.controller_cert = identity.cert_pem if identity else ""
        # This run's term (terms.py): what its agents carry, and the hosts keep the highest of.
        takeover = self.adoption is not None and self.adoption.takeover
        self.term = self.resume.next_term(takeover=takeover) if self.resume is not None else 1
        self.fleet.agents.term = self.standby.term = self.term
        if takeover:
            self.standby.hold_term()  # until most agents came: see StandbyDesk.held
        me = psutil.Process()
        self._write_control_file("127.0.0.1" if bind == "0.0.0.0" else bind, port)
        self.journal.record(
            "job_started",
            job_id=cfg.job_id,
            name=cfg.job_name,
            controller_pid=me.pid,
            controller_host=socket.gethostname(),
            controller_create_time=me.create_time(),
            control_port=port,
            hosts=list(cfg.hosts),
            spares=list(cfg.spares),
            min_nodes=cfg.min_nodes,
            max_nodes=self.roster.want,
            nproc_per_node=cfg.nproc_per_node,
            max_restarts=cfg.max_restarts,
            entrypoint=cfg.entrypoint(),
            run=self.term,
            **self._slurm_fields(),
        )
        if self.resume is not None:
            self.resumption.journal_start(
                self.resume,
                adopting=self.adoption is not None,
                next_gen=self.generation + 1,
                batch_loss=await self._batch_loss(self.resume),
                lost_at=self.adoption.lost_at if self.adoption is not None else None,
            )
        self.quarantine.bench_known(self.job)
        self.signals.install()
        stood_down: StoodDown | None = None
        try:
            result = await self.internal.guard(self._start_and_supervise(port))
            outcome = self.internal.outcome(result) if isinstance(result, TaskFailure) else result
        except StoodDown as e:  # a standby the agents did not come to: the primary leads
            stood_down = e
        except FtrunError as e:
            outcome = JobOutcome.failed(e.message, {"hint": e.hint}, exit_code=e.exit_code)
        finally:
            self.signals.remove()
            if stood_down is None:  # else the agents that came are the primary's: let go
                await self.fleet.stop_all()
            await self.server.close()
            self.journal.files.unlink(CONTROL_FILE)
        if stood_down is not None:
            self.journal.record("stood_down", reason=stood_down.message)
            raise stood_down
        self.journal.record(
            "job_finished",
            state=outcome.state.value,
            exit_code=outcome.exit_code,
            reason=outcome.reason,
            root_cause=outcome.root_cause,
            restarts=self.incidents.restarts,
            replacements=self.incidents.replacements,
            generation=self.generation,
        )
        return outcome

    async def _listen(self, bind: str, context: ssl.SSLContext | None) -> int:
        """The control port: the old controller's when adopting (its agents dial it), else a
        free one. A port taken meanwhile means no adoption: the agents cannot find us."""
        if self.adoption is not None:
            try:
                return await self.server.start(host=bind, port=self.adoption.port, tls=context)
            except OSError as e:
                self.reporter.notice(
                    f"cannot listen on port {self.adoption.port} again ({e.strerror}): the "
                    "running generation cannot be adopted",
                    level="warning",
                )
                self.adoption = None
        return await self.server.start(host=bind, tls=context)

    async def _start_and_supervise(self, port: int) -> JobOutcome:
        if self.adoption is not None:
            try:
                adopted = await self.resumption.adopt(
                    self.adoption, port, next_gen=self.generation + 1
                )
            except Interrupted:
                return self._interrupted()
            if adopted is not None:
                return await self._supervise(adopted)
        started = await self.fleet.start_all(port)
        if not await self.inbox.agents_started(set(started), self.config.agent_start_timeout_s):
            return (
                self._interrupted()
                if self.signals.preempt_pending
                else JobOutcome.stopped("stopped before the job started")
            )
        return await self._supervise()

    async def _batch_loss(self, point: ResumePoint) -> BatchLoss | None:
        """A Slurm run requeued after its controller died: the note of the agent that requeued
        it because the batch node was lost, if one did (requeue_note.py)."""
        slurm = options_of(self.config, SlurmOptions)
        if (
            point.finished is not None
            or slurm is None
            or not slurm.slurm_job_id
            or slurm.slurm_restart_count <= point.slurm_restart_count
        ):
            return None
        return await asyncio.to_thread(
            requeue_note.read, slurm.slurm_job_id, previous_last_t=point.last_t
        )

    def _slurm_fields(self) -> dict[str, object]:
        slurm = options_of(self.config, SlurmOptions)
        if slurm is None or slurm.slurm_job_id is None:
            return {}
        return {
            "slurm_job_id": slurm.slurm_job_id,
            "slurm_restart_count": slurm.slurm_restart_count,
        }

    def _write_control_file(self, host: str, port: int) -> None:
        """Where `ftrun chaos` and `ftrun hosts` find the controller, with the job secret:
        readable by the owner only; written whole and renamed in, never through a link."""
        control = {"host": host, "port": port, "secret": self.secret}
        control["cert"] = self.fleet.controller_cert
        self.journal.files.replace(CONTROL_FILE, json.dumps(control).encode(), mode=0o600)

    # ---- generations ------------------------------------------------------------------------

    async def _supervise(self, adopted: GenWatch | None = None) -> JobOutcome:
        """Launch, watch, end and relaunch generations until the job ends; the first one is
        `adopted` when a resumed controller took a running generation over. What to do next is
        the job machine's decision (job.py); waiting, launching and tearing down are ours."""
        self.checks.settle()  # the first agents are in: the job's versions (host_checks.py)
        if adopted is None and not await self.links.before_first():  # --link-check
            return self._interrupted()
        if adopted is not None:
            hosts = list(adopted.hosts.values())
        else:
            first = self.job.first_plan()
            if isinstance(first, End):
                return first.outcome
            hosts = first
        while True:
            if self.signals.count or self.signals.preempt_pending:
                return self._interrupted()  # a Ctrl-C or a notice while we tore down or waited
            if adopted is not None:
                watch, adopted = adopted, None
            else:
                watch = self._launch(self.job.launch(hosts))
            result = await self.watcher.watch(watch)
            end = self.judge(watch, result, stop_requests=self.signals.count)
            if end.graceful is not None:
                began = time.monotonic()
                await self.teardown(watch, graceful=end.graceful)
                self.plans.torn_down(time.monotonic() - began)
                if end.incident is not None:
                    self.journal.record("torn_down", incident=end.incident, gen=watch.number)
            self.journal.record(
                "generation_ended", gen=watch.number, outcome=end.outcome, step=watch.max_step
            )
            if end.notice is not None:
                self.reporter.notice(end.notice[0], level=end.notice[1])
            after = self.job.after(end)
            if isinstance(after, End):
                return after.outcome
            next_hosts = await self._next_hosts(watch, end, after.delay_s)
            if isinstance(next_hosts, JobOutcome):
                return next_hosts
            hosts = next_hosts

    async def _next_hosts(
        self, watch: GenWatch, end: Ending, delay: float
    ) -> list[str] | JobOutcome:
        """Between a torn-down generation and the next: the back-off waited out, the hosts that
        would join probed (--link-check), then the job machine's plan. A JobOutcome when the
        job ends here instead. A lost host's ranks may
        still run (a partition): the next generation starts anyway, because nothing they do can
        reach it (docs/fencing.md)."""
        self.fleet.release_removed()
        if self.signals.count:
            # A stop came while this generation went down: under scancel, Slurm signals the
            # ranks and the controller at once, and a rank's SIGTERM can win by milliseconds.
            # The job was stopped, not failed for want of the hosts the stop took away.
            return self._interrupted()
        if delay:
            self.reporter.notice(f"{end.why}; next attempt in {delay:g} s", level="warning")
            if await self.inbox.stop_requested_within(delay):
                return self._interrupted()
        if not await self.links.before_join(watch.hosts):  # --link-check: new hosts only
            return self._interrupted()
        relaunch = self.job.relaunch(end, watch, backoff_s=delay)
        notices = relaunch.notices if isinstance(relaunch, Relaunch) else [relaunch.notice]
        for notice in notices:
            if notice is not None:
                self.reporter.notice(notice[0], level=notice[1])
        return relaunch.hosts if isinstance(relaunch, Relaunch) else relaunch.outcome

    def _interrupted(self) -> JobOutcome:
        """A stop, or a preemption notice that came with no generation running (while agents
        started, a teardown, a backoff): nothing to checkpoint, the last commit stands."""
        if self.signals.count or not self.signals.preempt_pending:
            return JobOutcome.stopped()
        why = f"preempted ({self.signals.preempt_pending}) between generations"
        return JobOutcome.preempted(
            why + ("; requeueing" if self.config.requeue else ""), requeue=self.config.requeue
        )

    def _launch(self, spec: LaunchSpec) -> GenWatch:
        agents = self.fleet.launch(
            spec.number, spec.hosts, hang=spec.hang, restarts=spec.restarts, env=spec.env
        )
        return GenWatch(
            spec.number,
            set(agents),
            dict(zip(agents, spec.hosts, strict=True)),
            order=agents,
            stall=self.stalls.watch(set(agents)),
            journal=self.journal,
            reporter=self.reporter,
            nproc_per_node=self.config.nproc_per_node,
        )
