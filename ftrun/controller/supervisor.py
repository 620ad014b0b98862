"""The supervise loop: launch a generation, watch it, classify what went wrong, act, repeat.

    start agents ─▶ launch G ─▶ watch ─┬─ all hosts exited 0 ───────────────▶ succeeded
                      ▲                ├─ a rank exited 0, others hung ─▶ kill ▶ succeeded
                      │                │     (exit barrier, stall.py; an exit_hang incident)
                      │                ├─ Ctrl-C / SIGTERM ─▶ graceful stop ─▶ stopped
                      │                └─ fault ─▶ classify ─▶ tear down (SIGKILL: it is broken)
                      │                              ├─ fatal / no replacement ──▶ failed
                      └──── backoff ◀────────────────┘ restart in place (G+1)

Every decision is an event in the journal; `status` and `inspect` read nothing else. So is every
failure of the job's own machinery (internal.py): a controller or agent task that fails is
restarted or ends the job with it as the root cause, never a controller that silently stops.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import time
from typing import Any

import psutil

from ftrun.config import LaunchConfig
from ftrun.controller import evidence as ev_from
from ftrun.controller.chaos import ChaosDesk
from ftrun.controller.evidence import Evidence, Failure
from ftrun.controller.fleet import Fleet
from ftrun.controller.generation import GenWatch, Reconfigure, free_port, record_output, root_cause
from ftrun.controller.host_health import HostHealth
from ftrun.controller.internal import InternalFailures
from ftrun.controller.reporting import JobOutcome, Reporter
from ftrun.controller.policy_file import FaultPolicy
from ftrun.controller.policy import Decision, History, Tier, backoff_s, classify
from ftrun.controller.roster import NotEnoughHosts
from ftrun.controller.server import ControlServer
from ftrun.controller.stall import ExitHang
from ftrun.controller.stalldesk import StallDesk
from ftrun.errors import FtrunError
from ftrun.journal import Journal
from ftrun.protocol import new_secret
from ftrun.tasks import TaskFailure
from ftrun.transport.base import Transport

log = logging.getLogger("ftrun.controller")

TEARDOWN_MARGIN_S = 10.0
CONTROL_FILE = "control.json"



class Supervisor:
    def __init__(self, config: LaunchConfig, *, policy: FaultPolicy, journal: Journal,
                 transport: Transport, reporter: Reporter) -> None:
        self.config = config
        self.policy = policy
        self.journal = journal
        self.transport = transport
        self.reporter = reporter
        self.secret = new_secret()
        self.internal = InternalFailures(journal, reporter, generation=lambda: self.generation)
        self.server = ControlServer(self.secret, expected_agents=set(),
                                    heartbeat_interval_s=config.heartbeat_interval_s,
                                    host_lost_timeout_s=config.host_lost_timeout_s,
                                    local_stall_timeout_s=config.local_stall_timeout_s,
                                    alive=lambda agent_id: self.fleet.agent_alive(agent_id),
                                    on_event=journal.record,
                                    tasks=self.internal.tasks)
        self.fleet = Fleet(config, transport=transport, server=self.server, journal=journal,
                           reporter=reporter, secret=self.secret, environ=dict(os.environ),
                           tasks=self.internal.tasks)
        self.roster = self.fleet.roster
        self.health = HostHealth(policy.quarantine)
        self.chaos = ChaosDesk(self.server, journal, nproc_per_node=config.nproc_per_node)
        self.stalls = StallDesk(config, server=self.server, journal=journal)
        self.signals = 0
        self.generation = 0
        self.watch: GenWatch | None = None
        self.restarts = 0
        self.ever_progressed = False

    # ---- top level --------------------------------------------------------------------------

    async def run(self) -> JobOutcome:
        cfg = self.config
        bind = self.transport.bind_address()
        port = await self.server.start(host=bind)
        me = psutil.Process()
        self._write_control_file("127.0.0.1" if bind == "0.0.0.0" else bind, port)
        self.journal.record("job_started", job_id=cfg.job_id, name=cfg.job_name,
                            controller_pid=me.pid, controller_create_time=me.create_time(),
                            control_port=port, hosts=list(cfg.hosts), spares=list(cfg.spares),
                            min_nodes=cfg.min_nodes,
                            nproc_per_node=cfg.nproc_per_node, max_restarts=cfg.max_restarts,
                            entrypoint=cfg.entrypoint())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)
        forwarded = [signal.Signals[name] for name in cfg.forward_signals]
        for sig in forwarded:
            loop.add_signal_handler(sig, self._forward_signal, sig)
        try:
            outcome = await self.internal.guard(self._start_and_supervise(port))
            if isinstance(outcome, TaskFailure):
                outcome = JobOutcome.failed(
                    f"internal error: {outcome.task} failed "
                    f"({outcome.error})", {"kind": "internal", "task": outcome.task,
                                           "exception": outcome.error,
                                           "traceback": outcome.traceback,
                                           "log": str(self.journal.job_dir / "events.jsonl")})
        except FtrunError as e:
            outcome = JobOutcome.failed(e.message, {"hint": e.hint}, exit_code=e.exit_code)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM, *forwarded):
                loop.remove_signal_handler(sig)
            await self._stop_agents()
            await self.server.close()
            (self.journal.job_dir / CONTROL_FILE).unlink(missing_ok=True)
        self.journal.record("job_finished", state=outcome.state.value, exit_code=outcome.exit_code,
                            reason=outcome.reason, root_cause=outcome.root_cause,
                            restarts=self.restarts, generation=self.generation)
        return outcome

    async def _start_and_supervise(self, port: int) -> JobOutcome:
        outcome = await self._start_agents(port)
        return outcome if outcome is not None else await self._supervise()

    def _write_control_file(self, host: str, port: int) -> None:
        """Where `ftrun chaos` and `ftrun hosts` find the controller, with the job secret:
        readable by the owner only."""
        path = self.journal.job_dir / CONTROL_FILE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"host": host, "port": port, "secret": self.secret}, f)

    def _on_signal(self, sig: signal.Signals) -> None:
        self.signals += 1
        self.journal.record("stop_requested", signal=sig.name, count=self.signals)
        if self.signals == 1:
            self.reporter.notice(f"{sig.name}: stopping; ranks get SIGTERM, then SIGKILL after "
                                 f"{self.config.term_timeout_s:g} s (again to kill now)",
                                 level="warning")
        else:
            self.reporter.notice("killing now", level="warning")
            self.server.broadcast("stop", gen=self.generation, grace_s=0)
        self.server.inbox.put_nowait(("", {"kind": "stop_requested"}))

    def _forward_signal(self, sig: signal.Signals) -> None:
        """--forward-signal: to every rank of the running generation (not to torchrun, which
        would die of it), for the script's own handler: a preemption notice, say."""
        self.journal.record("signal_forwarded", signal=sig.name, gen=self.generation or None)
        self.reporter.notice(f"{sig.name}: passing it on to the ranks")
        self.server.broadcast("signal", gen=self.generation, signal=sig.name)

    async def _start_agents(self, port: int) -> JobOutcome | None:
        cfg = self.config
        waiting = set(await self.fleet.start_all(port))
        deadline = time.monotonic() + cfg.agent_start_timeout_s
        while waiting:
            try:
                agent_id, msg = await asyncio.wait_for(self.server.inbox.get(),
                                                       max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                self.fleet.never_connected(waiting)
                break
            if msg["kind"] == "stop_requested":
                return JobOutcome.stopped("stopped before the job started")
            if msg["kind"] == "hello":
                self.fleet.on_message(agent_id, msg)
                waiting.discard(agent_id)
            elif msg["kind"] == "agent_lost":
                self.fleet.on_lost(agent_id)
                waiting.discard(agent_id)
            else:
                self._side_channel(agent_id, msg, None)
        return None

    async def _stop_agents(self) -> None:
        await self.fleet.stop_all()

    def _side_channel(self, sender: str, msg: dict[str, Any], watch: GenWatch | None) -> bool:
        """Chaos, `ftrun hosts`, agents (re)connecting: handled the same in every phase."""
        if self.chaos.handle(sender, msg, watch):
            return True
        if msg["kind"] == "agent_error":
            self.internal.on_agent_error(sender, msg)
            return True
        if msg["kind"] == "hosts" and sender in self.server.clients:
            ok, text = self.fleet.request(msg)
            self.server.send(sender, "hosts_ack", ok=ok, message=text)
            return True
        if msg["kind"] == "hello":
            return self.fleet.on_message(sender, msg)
        if msg["kind"] == "agent_lost" and (watch is None or sender not in watch.agents):
            self.fleet.on_lost(sender)
            return True
        self.fleet.on_message(sender, msg)  # a stopped agent's fresh port
        return False

    # ---- generations ------------------------------------------------------------------------

    async def _supervise(self) -> JobOutcome:
        cfg = self.config
        previous: Evidence | None = None
        failures_in_row = 0
        incident = 0
        try:
            hosts = self._plan()
        except NotEnoughHosts as e:
            return JobOutcome.failed(self._too_few("cannot start", e), {"hint": e.hint})
        while True:
            if self.signals:  # a Ctrl-C that came while we tore down, waited or planned
                return JobOutcome.stopped()
            self.generation += 1
            watch = self._launch(self.generation, hosts)
            result = await self._watch(watch)
            if result == "succeeded":
                self.journal.record("generation_ended", gen=watch.number, outcome="succeeded",
                                    step=watch.max_step)
                return JobOutcome.succeeded("every rank exited 0")
            if result == "stopped":
                await self._teardown(watch, graceful=self.signals < 2)
                self.journal.record("generation_ended", gen=watch.number, outcome="stopped",
                                    step=watch.max_step)
                return JobOutcome.stopped()
            if isinstance(result, ExitHang):
                incident += 1
                return await self._exit_hang(watch, result, incident)
            if isinstance(result, Reconfigure):
                # Planned: the ranks get SIGTERM and the grace period (a script that saves on
                # SIGTERM loses nothing), then the job relaunches on the new set of hosts.
                self.journal.record("reconfigure", gen=watch.number, why=result.why,
                                    detail=result.detail, step=watch.max_step)
                self.reporter.notice(f"{result.detail}: relaunching on the new set of hosts")
                await self._teardown(watch, graceful=True)
                self.journal.record("generation_ended", gen=watch.number, outcome="reconfigured",
                                    step=watch.max_step)
                self.fleet.release_removed()
                if await self._wait_fenced(0):  # a host lost during the teardown
                    return JobOutcome.stopped()
                try:
                    hosts = self._plan()
                except NotEnoughHosts as e:
                    return JobOutcome.failed(self._too_few(result.detail, e))
                continue

            assert isinstance(result, Failure)
            ev = result.evidence
            result.attribute_injection(watch.injected)
            incident += 1
            progressed = watch.max_step is not None and (
                previous is None or previous.step is None or watch.max_step > previous.step)
            self.ever_progressed |= watch.first_step_seen
            self.journal.record("fault_detected", incident=incident, gen=watch.number,
                                fault=ev.kind, host=ev.host, rank=ev.rank, fault_t=result.fault_t,
                                detected_t=result.detected_t, exit_code=ev.exit_code,
                                signal=ev.signal, step=ev.step, exception=ev.exception,
                                **result.detail)
            clean = watch.stall.clean if watch.stall is not None else None
            decision = self._decide(ev, History(restarts_used=self.restarts,
                                                ever_progressed=self.ever_progressed,
                                                previous=previous,
                                                progressed_since_previous=progressed,
                                                work_done_by=clean[0] if clean else None))
            self.journal.record("fault_classified", incident=incident, tier=decision.tier.value,
                                decision="stop" if decision.tier is Tier.FATAL else "restart",
                                rule=decision.rule, reason=decision.reason)
            await self._teardown(watch, graceful=False)
            self.journal.record("torn_down", incident=incident, gen=watch.number)
            self.journal.record("generation_ended", gen=watch.number, outcome="failed",
                                step=watch.max_step)
            if decision.tier is Tier.FATAL:
                self.reporter.notice(f"fatal: {decision.reason}", level="error")
                return JobOutcome.failed(decision.reason,
                                  root_cause(self.journal, ev, watch.number, result))
            self.fleet.release_removed()
            if await self._wait_fenced(incident):
                return JobOutcome.stopped()
            failures_in_row = 1 if progressed else failures_in_row + 1
            delay = backoff_s(failures_in_row, base_s=cfg.backoff_base_s, cap_s=cfg.backoff_cap_s)
            if delay:
                self.reporter.notice(f"{decision.reason}; next attempt in {delay:g} s",
                                     level="warning")
                if await self._stop_requested_within(delay):
                    return JobOutcome.stopped()
            # Planned only now, right before the launch: hosts may have been lost (or come back)
            # while we waited.
            try:
                hosts = self._plan()
            except NotEnoughHosts as e:
                reason = self._too_few(decision.reason, e)
                self.reporter.notice(f"fatal: {reason}", level="error")
                return JobOutcome.failed(reason,
                                  root_cause(self.journal, ev, watch.number, result))
            self.fleet.journal_replan(incident, list(watch.hosts.values()), hosts)
            self.restarts += 1
            previous = ev
            self.journal.record("restart", incident=incident, next_gen=self.generation + 1,
                                backoff_s=delay, restarts=self.restarts)
            self.reporter.notice(f"{decision.reason} (restart {self.restarts}/{cfg.max_restarts})",
                                 level="warning")

    def _decide(self, ev: Evidence, history: History) -> Decision:
        decision = classify(ev, history, max_restarts=self.config.max_restarts,
                            rules=self.policy.rules)
        decision, benched = self.health.judge(ev, decision, now=time.monotonic(),
                                              wall_t=time.time())
        for fields in benched:
            self.journal.record("host_quarantined", **fields)
        return decision

    def _plan(self) -> list[str]:
        return self.roster.plan(excluded=self.health.excluded(time.monotonic()))

    def _too_few(self, why: str, e: NotEnoughHosts) -> str:
        left = ", ".join(e.usable) or "none"
        return (f"{why}, and no spare host is ready to take its place: {len(e.usable)} usable "
                f"host(s) ({left}), fewer than --min-nodes {e.min_nodes}")

    async def _wait_fenced(self, incident: int) -> bool:
        """Lost hosts' ranks must be dead before the next generation starts: wait out their
        agents' fence timeout (they kill their ranks when they stop hearing from us).
        True when a stop was requested meanwhile."""
        hosts, wait = self.fleet.fence_wait()
        if wait <= 0:
            return False
        self.journal.record("fence_wait", incident=incident, hosts=hosts, wait_s=round(wait, 3))
        return await self._stop_requested_within(wait)

    def _launch(self, number: int, hosts: list[str]) -> GenWatch:
        cfg = self.config
        agents = [self.fleet.agent_of(h) or "" for h in hosts]
        master = agents[0]
        port = cfg.master_port or self.fleet.take_port(master) or free_port()
        hang = dataclasses.replace(self.policy.hang, expect_progress=(
            self.policy.hang.expect_progress or bool(cfg.progress_regex) or self.ever_progressed))
        for node_rank, agent_id in enumerate(agents):
            self.server.send(agent_id, "launch", gen=number, nnodes=len(agents),
                             node_rank=node_rank, nproc_per_node=cfg.nproc_per_node,
                             master_addr=self.fleet.addrs.get(master, "127.0.0.1"),
                             master_port=port, entrypoint=cfg.entrypoint(), cwd=cfg.cwd,
                             progress_regex=cfg.progress_regex, hang=dataclasses.asdict(hang),
                             idle_timeout_s=cfg.idle_timeout_s,
                             env=self._rank_env())
        world = len(agents) * cfg.nproc_per_node
        self.journal.record("generation_launched", gen=number, hosts=hosts, world_size=world,
                            master_port=port, master_addr=self.fleet.addrs.get(master))
        self.reporter.notice(f"generation {number}: {world} rank(s) on {', '.join(hosts)}")
        self.watch = GenWatch(number, set(agents), dict(zip(agents, hosts)), order=agents,
                              stall=self.stalls.watch(set(agents)))
        return self.watch

    def _rank_env(self) -> dict[str, str]:
        """ftrun's variables for this generation's ranks. The TORCHELASTIC_ ones replace
        torchrun's own (always 0: it never restarts under ftrun) in the rank shim."""
        return {"FTRUN_JOB_DIR": str(self.journal.job_dir),
                "FTRUN_TORCHELASTIC_RESTART_COUNT": str(self.restarts),
                "FTRUN_TORCHELASTIC_MAX_RESTARTS": str(self.config.max_restarts)}

    async def _watch(self, watch: GenWatch) -> str | Failure | Reconfigure | ExitHang:
        stall = watch.stall
        assert stall is not None
        while True:
            if (stalled := self.stalls.poll(watch, stall)) is not None:
                return stalled
            wake = stall.wakeup()
            try:
                agent_id, msg = await asyncio.wait_for(
                    self.server.inbox.get(),
                    None if wake is None else max(0.0, wake - time.monotonic()))
            except asyncio.TimeoutError:
                continue
            kind = msg["kind"]
            if kind == "stop_requested":
                return "stopped"
            if kind == "agent_lost" and agent_id in watch.agents:
                msg = {**msg, "reason": self.internal.lost_reason(agent_id, msg.get("reason"))}
                host = self.fleet.on_lost(agent_id) or watch.hosts[agent_id]
                return ev_from.host_lost(msg, host, watch.max_step)
            if self._side_channel(agent_id, msg, watch):
                if (change := self._reconfiguration(watch)) is not None:
                    return change
                continue
            host = watch.hosts.get(agent_id, "?")
            if msg.get("gen") != watch.number:
                continue  # stale: from an older generation
            if record_output(self.journal, self.reporter, watch, host, msg):
                if kind == "progress":
                    stall.on_progress(time.monotonic())
                    if (change := self._reconfiguration(watch)) is not None:
                        return change
                continue
            if kind in ("rank_exited", "rank_hung") and msg.get("step") is not None:
                watch.max_step = max(watch.max_step or 0, msg["step"])
            if self.stalls.news(watch, stall, agent_id, host, msg):
                continue
            if kind == "rank_exited" and (msg.get("exit_code") != 0 or msg.get("signal")):
                self.journal.record("rank_exited", gen=watch.number, host=host,
                                    **{k: msg.get(k) for k in ("rank", "pid", "exit_code", "signal",
                                                               "t_exit", "step", "exception",
                                                               "traceback", "traceback_source")})
                return ev_from.crash(msg, host, watch.max_step)
            if kind == "rank_hung":
                return ev_from.hang(msg, host, watch.max_step)
            if kind == "gen_exited":
                if msg.get("exit_code") == 0:
                    watch.done.add(agent_id)
                    stall.on_agent_done(agent_id)
                    if watch.done >= watch.agents:
                        return "succeeded"
                else:
                    return ev_from.torchrun_exit(msg, host, watch.max_step, time.time())

    def _reconfiguration(self, watch: GenWatch) -> Reconfigure | None:
        """A host of this generation was removed, or ready hosts can grow a shrunken job. Grow
        only once this generation steps (its start-up is paid; no flapping while it starts)."""
        if watch.stall is not None and watch.stall.finishing:
            return None  # its work is done: it ends, whatever the hosts do
        removed = self.roster.needs_replacing()
        if removed:
            return Reconfigure("remove", f"{', '.join(removed)} removed from the job")
        if not watch.first_step_seen:
            return None
        joining = self.roster.can_grow(excluded=self.health.excluded(time.monotonic()))
        if joining:
            return Reconfigure("grow", f"{', '.join(joining)} ready: growing from "
                                       f"{len(watch.agents)} host(s)")
        return None

    async def _exit_hang(self, watch: GenWatch, hang: ExitHang, incident: int) -> JobOutcome:
        """A rank exited 0 and others did not exit in time: the incident (with their stacks) is
        recorded, the generation killed, and the job finished. Every rank that exited did so
        with 0 (a failure would have ended the watch first) and the work is done: succeeded."""
        reason = self.stalls.record_exit_hang(watch, hang, incident)
        await self._teardown(watch, graceful=False)
        self.journal.record("torn_down", incident=incident, gen=watch.number)
        self.journal.record("generation_ended", gen=watch.number, outcome="exit_hang",
                            step=watch.max_step)
        self.reporter.notice(f"{reason} (incident {incident} has their stacks)", level="warning")
        return JobOutcome.succeeded(reason)

    async def _teardown(self, watch: GenWatch, *, graceful: bool) -> None:
        number = watch.number
        grace = self.config.term_timeout_s if graceful else 0.0
        pending = {a for a, link in self.server.links.items() if not link.lost}
        self.server.broadcast("stop", gen=number, grace_s=grace)
        deadline = time.monotonic() + grace + TEARDOWN_MARGIN_S
        while pending:
            try:
                agent_id, msg = await asyncio.wait_for(self.server.inbox.get(),
                                                       max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                # Not confirmed: we cannot count on those hosts; they fence once we stop
                # talking to them, and the next generation waits for that.
                log.error("agents did not confirm the stop of generation %s: %s", number, pending)
                for agent_id in pending:
                    self.server.drop(agent_id, "did not confirm the stop of its generation")
                    self.fleet.on_lost(agent_id)
                break
            if msg["kind"] == "agent_lost":
                pending.discard(agent_id)
                self.fleet.on_lost(agent_id)
            elif msg["kind"] == "stopped" and msg.get("gen") == number:
                pending.discard(agent_id)
                self.fleet.on_message(agent_id, msg)
                if msg.get("survivors"):
                    self.reporter.notice(f"processes survived SIGKILL on "
                                         f"{watch.hosts.get(agent_id, agent_id)}: "
                                         f"{msg['survivors']}", level="error")
            elif msg["kind"] == "agent_error":
                self.internal.on_agent_error(agent_id, msg)
            elif msg.get("gen") == number and agent_id in watch.agents:
                record_output(self.journal, self.reporter, watch, watch.hosts[agent_id], msg)
            else:
                self._side_channel(agent_id, msg, None)
        self.journal.close_generation_logs(number)

    async def _stop_requested_within(self, delay_s: float) -> bool:
        deadline = time.monotonic() + delay_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                agent_id, msg = await asyncio.wait_for(self.server.inbox.get(), left)
            except asyncio.TimeoutError:
                return False
            if msg["kind"] == "stop_requested":
                return True
            self._side_channel(agent_id, msg, None)
        return False
