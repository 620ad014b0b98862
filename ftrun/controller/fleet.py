"""The job's hosts and their agents: start them (all at once), learn where they are, restart the
agents of lost hosts, take `ftrun hosts add/remove` requests, launch each generation on them,
stop them all at the end.

Which hosts a generation runs on is the Roster's business (pure), where its ranks meet the
Rendezvous's (rendezvous.py); keeping an agent running on a host (start, hello deadline,
retries with back-off, terminate) is AgentProcesses' (agent_processes.py). This module decides
what each hello, loss and request means for the job, and does the I/O around it: the journal,
the console, the messages to the agents.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ftrun import peer_kernel
from ftrun.config import LaunchConfig
from ftrun.controller.agent_processes import AgentProcesses
from ftrun.controller.jobkey import job_checkpoint_key
from ftrun.controller.rendezvous import Rendezvous
from ftrun.controller.reporting import Reporter
from ftrun.controller.roster import HostState, Roster
from ftrun.controller.server import ControlServer
from ftrun.controller.shm_notes import hello_note
from ftrun.journal import Journal
from ftrun.tasks import TaskSupervisor
from ftrun.transport.base import Transport
from ftrun.wire.inbound import Hello, Hosts, Stopped

# An agent's machine that acknowledged our heartbeats (every 0.25 s) this recently is there: well
# inside the host-lost timeout (1 s), so a host that lost power is still lost at the timeout.
AGENT_ANSWER_WINDOW_S = 0.5


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
        # Each ready agent's hello, for the host checks (desks.py sets it: host_checks.py).
        self.hello_checks: Callable[[str, Hello], None] = lambda host, msg: None
        # And each one's term and the standby's address (standby_desk.py; desks.py sets it).
        self.hello_standby: Callable[[str, str, Hello], None] = lambda agent, host, msg: None
        self.agents = AgentProcesses(
            config,
            transport=transport,
            server=server,
            journal=journal,
            reporter=reporter,
            roster=self.roster,
            rendezvous=self.rendezvous,
            secret=secret,
            env=self.env,
            checkpoint_key=self.checkpoint_key,
            tasks=self.tasks,
        )

    @property
    def port(self) -> int:
        """The controller's port, which the agents dial (set before they start)."""
        return self.agents.port

    @port.setter
    def port(self, port: int) -> None:
        self.agents.port = port

    @property
    def controller_cert(self) -> str:
        """The controller's certificate, which agents check when they dial over TLS (tls.py)."""
        return self.agents.controller_cert

    @controller_cert.setter
    def controller_cert(self, cert: str) -> None:
        self.agents.controller_cert = cert

    # ---- starting -----------------------------------------------------------------------------

    async def start_all(self, port: int) -> list[str]:
        """Start every host's agent at once; returns the agent ids that started (they say hello
        on the server's inbox). A host that cannot be reached is journaled, reported and LOST."""
        self.port = port
        return await self.agents.start_all(list(self.roster.slots))

    def never_connected(self, agent_ids: set[str]) -> None:
        """Agents that started but did not say hello in time: their hosts are lost."""
        self.agents.never_connected(agent_ids)

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
            self.agents.await_hello(agent_id, host)

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

    def on_stopped(self, agent_id: str, msg: Stopped) -> None:
        """An agent's ranks are stopped: the fresh port its host offers."""
        self.rendezvous.heard(agent_id, {"port": msg.port})

    def on_hello(self, agent_id: str, msg: Hello) -> None:
        """An agent said hello: the port its host offers, and, from the host's current agent,
        that it is ready and where."""
        self.rendezvous.heard(agent_id, {"port": msg.port})
        host = self.roster.host_of(agent_id)  # None: not the host's current agent (a stale one)
        if host is None or not self.roster.ready(agent_id):
            return
        addr = self.rendezvous.connected(agent_id, {"addr": msg.addr, "peer_port": msg.peer_port})
        self.hello_checks(host, msg)  # versions and clock (host_checks.py)
        self.hello_standby(agent_id, host, msg)
        shm = {
            k: v
            for k, v in (("shm_total", msg.shm_total), ("shm_free", msg.shm_free))
            if v is not None
        }
        self.journal.record("agent_connected", host=host, pid=msg.pid, addr=addr, agent=agent_id,
                            python=msg.python, torch=msg.torch, **shm)  # fmt: skip
        note = hello_note(host, msg)  # /dev/shm too small for a memory tier: said once
        if note is not None and self.roster.slots[host].incarnation <= 1:
            self.reporter.notice(note, level="warning")
        self.agents.reset_backoff(host)
        if self.roster.slots[host].incarnation > 1:
            self.reporter.notice(f"{host} is back (ready to join)")

    def on_lost(self, agent_id: str) -> str | None:
        """The agent's connection or heartbeats are gone: the host is LOST, and retried later.
        We stop talking to it now, so it fences within its fence timeout from now. The next
        generation does not wait for that: whatever its ranks still do is refused (generations
        fence each other, docs/fencing.md)."""
        host = self.roster.host_of(agent_id)
        if host is None:
            return None
        self.agents.drop(agent_id, host)
        return host

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
        """Whether the agent is there though silent: its process runs, where the transport
        can tell (local agents); else whether its machine still acknowledges our heartbeats
        (peer_kernel.py: a remote agent that is starved or stopped, not lost with its machine
        or cut off). None where neither can say (the silence then decides, as it did)."""
        alive = self.agents.alive(agent_id)
        if alive is not None:
            return alive
        link = self.server.links.get(agent_id)
        if link is None or link.lost:
            return None
        return peer_kernel.answers(
            link.channel.writer.get_extra_info("socket"),
            window_s=min(AGENT_ANSWER_WINDOW_S, self.config.host_lost_timeout_s / 2),
        )

    def agent_of(self, host: str) -> str | None:
        return self.roster.slots[host].agent_id if host in self.roster.slots else None

    # ---- `ftrun hosts JOB add|remove HOST` ----------------------------------------------------

    def request(self, msg: Hosts) -> tuple[bool, str]:
        action, host = msg.action, msg.host
        if not isinstance(host, str) or not host:
            return False, "name a host"
        if not self.config.remote:
            return False, "this job runs on this machine only; hosts need `ftrun launch --hosts`"
        if action == "add":
            if host in self.roster.slots and self.roster.state(host) is HostState.LOST:
                # The user says it is back (a spot host returned): try it now, not when the
                # retry backoff (up to RETRY_CAP_S) comes round.
                self.agents.reset_backoff(host)
                self.roster.add(host)
                self.journal.record("host_added", host=host, was="lost")
                self.agents.start_again(host)
                return True, f"{host} was lost: trying it again now"
            if host in self.roster.slots and self.roster.state(host) is not HostState.REMOVED:
                return False, f"{host} is already part of the job ({self.roster.state(host).value})"
            self.roster.add(host)
            self.journal.record("host_added", host=host)
            self.agents.start_again(host)
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
            self.agents.reset_backoff(host)
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
        for agent_id, handle in list(self.agents.handles.items()):
            if (
                handle.host in self.roster.slots
                and self.roster.state(handle.host) is HostState.REMOVED
            ):
                self._release(agent_id)

    def _release(self, agent_id: str) -> None:
        self.server.send(agent_id, "shutdown")
        self.agents.terminate(agent_id)

    # ---- the end ------------------------------------------------------------------------------

    async def stop_all(self) -> None:
        await self.agents.stop_all()
