"""The job's hosts and their agents: start them (all at once), learn where they are, restart the
agents of lost hosts, take `ftrun hosts add/remove` requests, launch each generation on them,
stop them all at the end.

Which hosts a generation runs on is the Roster's business (pure), where its ranks meet the
Rendezvous's (rendezvous.py); this module does the I/O around them: the transport, the
journal, the console.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ftrun.bootstrap import Bootstrap
from ftrun.config import LaunchConfig
from ftrun.controller.jobkey import job_checkpoint_key
from ftrun.controller.rendezvous import Rendezvous
from ftrun.controller.reporting import Reporter
from ftrun.controller.roster import HostState, Roster
from ftrun.controller.server import ControlServer
from ftrun.controller.shm_notes import hello_note
from ftrun.errors import FtrunError
from ftrun.journal import Journal
from ftrun.tasks import TaskSupervisor
from ftrun.transport.base import AgentHandle, Transport

log = logging.getLogger("ftrun.controller")

RETRY_FIRST_S = 1.0
RETRY_CAP_S = 30.0
TERMINATE_TIMEOUT_S = 5.0


class Fleet:
    def __init__(
        self,
        config: LaunchConfig,
        *,
        transport: Transport,
        server: ControlServer,
        journal: Journal,
        reporter: Reporter,
        secret: str,
        tasks: TaskSupervisor | None = None,
    ) -> None:
        self.config = config
        self.tasks = tasks or TaskSupervisor()
        self.transport = transport
        self.server = server
        self.journal = journal
        self.reporter = reporter
        self.secret = secret
        # --env, --env-file: the user's say beats what the launcher's environment forwards
        self.env = {**dict(config.forward_env), **dict(config.env)}
        self.checkpoint_key = job_checkpoint_key(journal.files, self.env)
        self.roster = Roster(
            config.hosts, config.spares, min_nodes=config.min_nodes, max_nodes=config.max_nodes
        )
        self.rendezvous = Rendezvous(config)
        self.handles: dict[str, AgentHandle] = {}
        self.port = 0
        self.controller_cert = ""  # set by the supervisor when agents dial over TLS (tls.py)
        # back-offs, hello deadlines: cancelled at the end
        self._waits: set[asyncio.Task[Any]] = set()
        self._work: set[asyncio.Task[Any]] = set()  # starts and stops: awaited at the end
        self._retry_delay: dict[str, float] = {}
        self.closing = False

    # ---- starting -----------------------------------------------------------------------------

    async def start_all(self, port: int) -> list[str]:
        """Start every host's agent at once; returns the agent ids that started (they say hello
        on the server's inbox). A host that cannot be reached is journaled, reported and LOST."""
        self.port = port
        hosts = list(self.roster.slots)
        started = await asyncio.gather(*(self._start(h) for h in hosts))
        return [a for a in started if a is not None]

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
            controller_grace_s=0.0 if cfg.transport == "slurm" else cfg.controller_grace_s,
            warm_start=cfg.warm_start,
            python=cfg.agent_python,
            env=self.env,
            zygote_preload=cfg.zygote_preload,
            controller_cert=self.controller_cert,
            checkpoint_key=self.checkpoint_key,
            umask=cfg.umask,
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
            self._terminate(agent_id)  # removed (or restarted) while it was starting
            return None
        self._spawn(self._hello_deadline(agent_id, host), self._waits)
        return agent_id

    async def _hello_deadline(self, agent_id: str, host: str) -> None:
        """An agent that started but never says hello (cannot dial us, exited at once) makes
        its host lost, to be retried, instead of leaving it STARTING for ever."""
        await asyncio.sleep(self.config.agent_start_timeout_s)
        if self.roster.host_of(agent_id) == host and self.roster.state(host) is HostState.STARTING:
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
                self._drop(agent_id, host)

    # ---- a resumed controller's agents (adoption.py) ----------------------------------------

    def expect_back(self, agents: dict[str, str]) -> set[str]:
        """The old controller's agents (host → agent id) may say hello again: the roster
        takes their ids (later agents of those hosts number on from them)."""
        for host, agent_id in agents.items():
            self.roster.expect(host, agent_id)
            self.server.expected.add(agent_id)
        return set(agents.values())

    def expect_spares(self, agents: dict[str, str]) -> None:
        """The old controller's other agents (host → id) may say hello again, as spares; one
        that does not within the start timeout makes its host lost, to be retried."""
        self.expect_back(agents)
        for host, agent_id in agents.items():
            self._spawn(self._hello_deadline(agent_id, host), self._waits)

    def release(self, agent_ids: list[str], why: str) -> None:
        """Agents of a generation that is not adopted: they fence (kill their ranks, exit),
        and their hosts start over with fresh agents."""
        for agent_id in agent_ids:
            self.server.send(agent_id, "fence", reason=f"not adopted: {why}")
            self.server.expected.discard(agent_id)
            host = self.roster.host_of(agent_id)
            if host is not None:
                self.roster.forget(host)

    # ---- what agents say ----------------------------------------------------------------------

    def on_message(self, agent_id: str, msg: dict[str, Any]) -> bool:
        """hello (ready, where) and stopped (a fresh port); True when the message was a hello."""
        self.rendezvous.heard(agent_id, msg)
        if msg["kind"] != "hello":
            return False
        host = self.roster.host_of(agent_id)  # None: not the host's current agent (a stale one)
        if host is None or not self.roster.ready(agent_id):
            return True
        addr = self.rendezvous.connected(agent_id, msg)
        shm = {k: msg[k] for k in ("shm_total", "shm_free") if msg.get(k) is not None}
        self.journal.record(
            "agent_connected", host=host, pid=msg.get("pid"), addr=addr, agent=agent_id, **shm
        )
        note = hello_note(host, msg)  # /dev/shm too small for a memory tier: said once
        if note is not None and self.roster.slots[host].incarnation <= 1:
            self.reporter.notice(note, level="warning")
        self._retry_delay.pop(host, None)
        if self.roster.slots[host].incarnation > 1:
            self.reporter.notice(f"{host} is back (ready to join)")
        return True

    def on_lost(self, agent_id: str) -> str | None:
        """The agent's connection or heartbeats are gone: the host is LOST, and retried later.
        We stop talking to it now, so it fences within its fence timeout from now. The next
        generation does not wait for that: whatever its ranks still do is refused (generations
        fence each other, docs/fencing.md)."""
        host = self.roster.host_of(agent_id)
        if host is None:
            return None
        self._drop(agent_id, host)
        return host

    def journal_replan(self, incident: int, before: list[str], hosts: list[str]) -> None:
        gone = [h for h in before if h not in hosts]
        new = [h for h in hosts if h not in before]
        if not gone and not new:
            return
        how = "replaced" if len(hosts) >= len(before) else "shrunk"
        self.journal.record(
            "hosts_changed",
            incident=incident,
            how=how,
            removed=gone,
            added=new,
            hosts=hosts,
            nodes_before=len(before),
            nodes_after=len(hosts),
        )
        change = f"{', '.join(gone)} → {', '.join(new)}" if new else f"without {', '.join(gone)}"
        self.reporter.notice(f"{how}: {change} ({len(hosts)} host(s))", level="warning")

    # ---- generations -------------------------------------------------------------------------

    def launch(
        self,
        number: int,
        hosts: list[str],
        *,
        hang: dict[str, Any],
        restarts: int,
        env: dict[str, str] | None = None,
    ) -> list[str]:
        """Tell each host's agent to start its torchrun for generation `number` (node rank by
        position in `hosts`), with the hang detector's settings `hang` (a HangPolicy as the
        agents take it) and ftrun's variables `env` for every rank (the plan); returns the
        agent ids in that order."""
        agents = [self.agent_of(h) or "" for h in hosts]
        launch = self.rendezvous.launch(
            number,
            agents,
            hang=hang,
            restarts=restarts,
            job_dir=self.journal.job_dir,
            env=env or {},
        )
        for agent_id, msg in zip(agents, launch.messages, strict=True):
            self.server.send(agent_id, "launch", **msg)
        world = len(agents) * self.config.nproc_per_node
        self.journal.record(
            "generation_launched",
            gen=number,
            hosts=hosts,
            world_size=world,
            master_port=launch.master_port,
            master_addr=launch.master_addr,
        )
        self.reporter.notice(f"generation {number}: {world} rank(s) on {', '.join(hosts)}")
        return agents

    def agent_alive(self, agent_id: str) -> bool | None:
        """Whether the agent's process runs, where the transport can tell (local agents);
        None where it cannot (a remote agent's ssh session says nothing about its host)."""
        handle = self.handles.get(agent_id)
        return handle.alive() if handle is not None else None

    def agent_of(self, host: str) -> str | None:
        return self.roster.slots[host].agent_id if host in self.roster.slots else None

    # ---- `ftrun hosts JOB add|remove HOST` ----------------------------------------------------

    def request(self, msg: dict[str, Any]) -> tuple[bool, str]:
        action, host = msg.get("action"), msg.get("host")
        if not isinstance(host, str) or not host:
            return False, "name a host"
        if not self.config.remote:
            return False, "this job runs on this machine only; hosts need `ftrun launch --hosts`"
        if action == "add":
            if host in self.roster.slots and self.roster.state(host) is HostState.LOST:
                # The user says it is back (a spot host returned): try it now, not when the
                # retry backoff (up to RETRY_CAP_S) comes round.
                self._retry_delay.pop(host, None)
                self.roster.add(host)
                self.journal.record("host_added", host=host, was="lost")
                self._spawn(self._start(host, retry=True), self._work)
                return True, f"{host} was lost: trying it again now"
            if host in self.roster.slots and self.roster.state(host) is not HostState.REMOVED:
                return False, f"{host} is already part of the job ({self.roster.state(host).value})"
            self.roster.add(host)
            self.journal.record("host_added", host=host)
            self._spawn(self._start(host, retry=True), self._work)
            return True, f"adding {host}: it joins when its agent is ready"
        if action == "remove":
            if host not in self.roster.slots or self.roster.state(host) is HostState.REMOVED:
                return False, f"{host} is not part of the job"
            others = [
                h for h in self.roster.in_state(HostState.ACTIVE, HostState.READY) if h != host
            ]
            if self.roster.state(host) is HostState.ACTIVE and len(others) < self.config.min_nodes:
                return False, (
                    f"without {host} the job would have {len(others)} host(s), fewer "
                    f"than --min-nodes {self.config.min_nodes}"
                )
            agent_id = self.roster.slots[host].agent_id
            before = self.roster.remove(host)
            self._retry_delay.pop(host, None)
            self.journal.record("host_removed", host=host, was=before.value)
            if agent_id is not None:
                self.server.expected.discard(agent_id)
                if before is not HostState.ACTIVE:
                    self._release(agent_id)
                # An active host's agent stops after the generation's graceful teardown
                # (release_removed), so its ranks get the grace period like everyone's.
            return True, f"removed {host} ({before.value})"
        return False, f"unknown hosts action {action!r} (add or remove)"

    def release_removed(self) -> None:
        """Stop the agents of removed hosts (after the teardown that gave their ranks grace)."""
        for agent_id, handle in list(self.handles.items()):
            if (
                handle.host in self.roster.slots
                and self.roster.state(handle.host) is HostState.REMOVED
            ):
                self._release(agent_id)

    def _release(self, agent_id: str) -> None:
        self.server.send(agent_id, "shutdown")
        self._terminate(agent_id)

    # ---- lost hosts: retried until they come back --------------------------------------------

    def _drop(self, agent_id: str, host: str) -> None:
        self.roster.lost(host)
        self.server.expected.discard(agent_id)
        self._terminate(agent_id)
        self._schedule_retry(host)

    def _terminate(self, agent_id: str) -> None:
        handle = self.handles.pop(agent_id, None)
        self.rendezvous.forget(agent_id)
        if handle is not None:
            self._spawn(handle.terminate(timeout_s=TERMINATE_TIMEOUT_S), self._work)

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


def _safe(host: str) -> str:
    """A host as a file name: user@host:port → user@host_port."""
    return host.replace("/", "_").replace(":", "_")
