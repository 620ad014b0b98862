"""The job's agents as processes: start one on a host through the transport (its Bootstrap, its
log file in the job's directory), give it a deadline to say hello, retry a lost host with
back-off until it comes back, terminate one, and stop them all at the end.

Which hosts are in the job, and what a hello or a loss means for them, is the Fleet's business
(fleet.py), with the Roster's pure bookkeeping; this module is the I/O that keeps an agent
running, or not, on each: the transport, the journal, the console.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from ftrun.bootstrap import Bootstrap
from ftrun.config import LaunchConfig
from ftrun.controller.rendezvous import Rendezvous
from ftrun.controller.reporting import Reporter
from ftrun.controller.roster import HostState, Roster
from ftrun.controller.server import ControlServer
from ftrun.errors import EXIT_SUPERSEDED, FtrunError
from ftrun.journal import Journal
from ftrun.tasks import TaskSupervisor
from ftrun.transport.base import AgentHandle, Transport
from ftrun.transport.options import SlurmOptions
from ftrun.transport.registry import backend, options_of

log = logging.getLogger("ftrun.controller")

RETRY_FIRST_S = 1.0
RETRY_CAP_S = 30.0
TERMINATE_TIMEOUT_S = 5.0


class AgentProcesses:
    def __init__(
        self,
        config: LaunchConfig,
        *,
        transport: Transport,
        server: ControlServer,
        journal: Journal,
        reporter: Reporter,
        roster: Roster,
        rendezvous: Rendezvous,
        secret: str,
        env: dict[str, str],
        checkpoint_key: str,
        tasks: TaskSupervisor,
    ) -> None:
        self.config = config
        self.transport = transport
        # A lost controller's agents keep their ranks for --controller-grace, so that a resumed
        # one can adopt them; not where the transport ends them with the controller (srun).
        self.waits = backend(config.transport).agents_wait_for_controller
        self.server = server
        self.journal = journal
        self.reporter = reporter
        self.roster = roster
        self.rendezvous = rendezvous
        self.secret = secret
        self.env = env
        self.checkpoint_key = checkpoint_key
        self.tasks = tasks
        self.handles: dict[str, AgentHandle] = {}
        self.port = 0
        self.controller_cert = ""  # set by the supervisor when agents dial over TLS (tls.py)
        # back-offs, hello deadlines: cancelled at the end
        self._waits: set[asyncio.Task[Any]] = set()
        self._work: set[asyncio.Task[Any]] = set()  # starts and stops: awaited at the end
        self._retry_delay: dict[str, float] = {}
        self.closing = False
        self.term = 1  # this controller's run of the job (terms.py); the supervisor sets it
        # A host refused our agent: a standby took the job over (job_signals.py sets it).
        self.superseded: Callable[[str], None] = lambda host: None

    # ---- starting -----------------------------------------------------------------------------

    async def start_all(self, hosts: list[str]) -> list[str]:
        """Start every host's agent at once; returns the agent ids that started."""
        started = await asyncio.gather(*(self._start(h) for h in hosts))
        return [a for a in started if a is not None]

    def start_again(self, host: str) -> None:
        """Start the host's agent anew, now (the back-off starts over once it says hello)."""
        self._spawn(self._start(host, retry=True), self._work)

    async def _start(self, host: str, *, retry: bool = False) -> str | None:
        cfg = self.config
        agent_id = self.roster.new_agent(host)
        self.server.expected.add(agent_id)
        boot = Bootstrap(
            controller_host="",
            controller_port=self.port,
            secret=self.secret,
            job_id=cfg.job_id,
            agent_id=agent_id,
            host=host,
            heartbeat_interval_s=cfg.heartbeat_interval_s,
            fence_timeout_s=cfg.fence_timeout_s,
            controller_grace_s=cfg.controller_grace_s if self.waits else 0.0,
            warm_start=cfg.warm_start,
            python=cfg.agent_python,
            env=self.env,
            zygote_preload=cfg.zygote_preload,
            controller_cert=self.controller_cert,
            checkpoint_key=self.checkpoint_key,
            umask=cfg.umask,
            term=self.term,
            **self._requeue_fields(),
        )
        try:
            fd = self.journal.files.open_append(f"agents/{_safe(host)}.log")
            with open(fd, "ab") as log:  # never through a link (ftrun/jobfiles.py)
                self.handles[agent_id] = await self.transport.start_agent(boot, log=log)
        except FtrunError as e:
            self.server.expected.discard(agent_id)
            self.roster.lost(host)
            self.journal.record("host_unreachable", host=host, error=e.message, retry=retry)
            if not retry:
                self.reporter.notice(e.message, level="warning")
            self._schedule_retry(host)
            return None
        if self.roster.host_of(agent_id) != host or self.roster.state(host) is HostState.REMOVED:
            self.terminate(agent_id)  # removed (or restarted) while it was starting
            return None
        self.await_hello(agent_id, host)
        return agent_id

    def _requeue_fields(self) -> dict[str, Any]:
        """Under Slurm with --requeue, the agents requeue the job if its batch node (ours) is
        lost (agent/slurm_requeue.py): the job and this run's restart count."""
        slurm = options_of(self.config, SlurmOptions)
        if not self.config.requeue or slurm is None or not slurm.slurm_job_id:
            return {}
        return {
            "slurm_requeue_job": slurm.slurm_job_id,
            "slurm_restart_count": slurm.slurm_restart_count,
        }

    def await_hello(self, agent_id: str, host: str) -> None:
        """An agent that started but never says hello (cannot dial us, exited at once) makes
        its host lost, to be retried, instead of leaving it STARTING for ever."""
        self._spawn(self._hello_deadline(agent_id, host), self._waits)

    async def _hello_deadline(self, agent_id: str, host: str) -> None:
        deadline = time.monotonic() + self.config.agent_start_timeout_s
        while time.monotonic() < deadline:
            await asyncio.sleep(min(HELLO_POLL_S, max(0.0, deadline - time.monotonic())))
            if (
                self.roster.host_of(agent_id) != host
                or self.roster.state(host) is not HostState.STARTING
            ):
                return
            handle = self.handles.get(agent_id)
            if handle is not None and handle.returncode == EXIT_SUPERSEDED:
                # A newer controller leads the job there (ftrun/terms.py): we were cut off.
                self.superseded(host)
                return
        self.never_connected({agent_id})

    def never_connected(self, agent_ids: set[str]) -> None:
        """Agents that started but did not say hello in time: their hosts are lost."""
        for agent_id in agent_ids:
            host = self.roster.host_of(agent_id)
            if host is not None:
                self.journal.record(
                    "host_unreachable",
                    host=host,
                    error="its agent did not connect back to the controller",
                )
                self.reporter.notice(
                    f"the agent on {host} did not connect back; see "
                    f"{self.journal.job_dir / 'agents'}",
                    level="warning",
                )
                self.drop(agent_id, host)

    def alive(self, agent_id: str) -> bool | None:
        """Whether the agent's process runs, where the transport can tell (local agents);
        None where it cannot (a remote agent's ssh session says nothing about its host)."""
        handle = self.handles.get(agent_id)
        return handle.alive() if handle is not None else None

    # ---- lost hosts: retried until they come back --------------------------------------------

    def drop(self, agent_id: str, host: str) -> None:
        """The host is lost: its agent is terminated, and the host retried later."""
        self.roster.lost(host)
        self.server.expected.discard(agent_id)
        self.terminate(agent_id)
        self._schedule_retry(host)

    def terminate(self, agent_id: str) -> None:
        handle = self.handles.pop(agent_id, None)
        self.rendezvous.forget(agent_id)
        if handle is not None:
            self._spawn(handle.terminate(timeout_s=TERMINATE_TIMEOUT_S), self._work)

    def reset_backoff(self, host: str) -> None:
        """The host is back (or the user says so, or it left the job): its next loss is
        retried after RETRY_FIRST_S again."""
        self._retry_delay.pop(host, None)

    def _schedule_retry(self, host: str) -> None:
        if self.closing or not self.config.remote:
            return  # this machine's own agent is not retried: the job ends without it
        delay = min(RETRY_CAP_S, 2 * self._retry_delay.get(host, RETRY_FIRST_S / 2))
        self._retry_delay[host] = delay
        self._spawn(self._retry(host, delay), self._waits)

    async def _retry(self, host: str, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        if self.closing or self.roster.state(host) is not HostState.LOST:
            return
        log.info("retrying %s", host)
        self._spawn(self._start(host, retry=True), self._work)

    # ---- the end ------------------------------------------------------------------------------

    async def stop_all(self) -> None:
        self.closing = True
        for task in list(self._waits):
            task.cancel()
        # Starts in flight finish (each is bounded by the ssh timeouts) so that their agents
        # are stopped too; stops in flight finish.
        await asyncio.gather(*self._work, return_exceptions=True)
        self.server.broadcast("shutdown")
        await asyncio.gather(
            *(h.terminate(timeout_s=TERMINATE_TIMEOUT_S) for h in self.handles.values()),
            return_exceptions=True,
        )
        self.handles.clear()

    def _spawn(self, coro: Any, tasks: set[asyncio.Task[Any]]) -> None:
        task = self.tasks.spawn(f"fleet: {coro.__qualname__}", coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)


HELLO_POLL_S = 0.5  # how often a starting agent's exit is looked at before its hello


def _safe(host: str) -> str:
    """A host as a file name: user@host:port → user@host_port."""
    return host.replace("/", "_").replace(":", "_")
