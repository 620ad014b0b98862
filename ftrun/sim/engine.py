"""A job through an availability trace, in simulated time, decided by the controller's own code.

What happens when a host leaves or joins is decided by the very objects the supervisor uses:
the Roster (which hosts a generation runs on, spares, growing back), Incidents with the fault
policy and quarantine (what tier a lost host is), GenWatch.reconfiguration (when a ready host
is a reason to grow) and the PlanDesk (which DP x PP layout, and whether a grow pays for its
restart, weighed with the switch cost it measures on the simulated clock). Only time is not
real: each phase of a recovery is charged from Costs (measured, costs.py), and training is
steps at the plan's step time. The simulated job writes a real journal (`Journal` with a
simulated clock), so goodput is computed by the same code as for a real job
(ftrun.jobview.goodput), and `ftrun inspect` can show a simulated job.

The baseline "checkpoint-restart" (torchrun elastic) runs through this same engine with its own
behaviour: DP only, every change of hosts restarts the job, and a restart restores the last
checkpoint written every `checkpoint_every_s` (baseline.py). What each phase and checkpoint costs
is charges.py's, the clock and its queue of what happens next clock.py's. The ideal needs no
engine (ideal.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ftrun.config import LaunchConfig
from ftrun.controller import evidence
from ftrun.controller.generation import GenWatch
from ftrun.controller.host_health import HostHealth
from ftrun.controller.incidents import Incidents
from ftrun.controller.planning import PlanDesk, Unplanned
from ftrun.controller.policy import Tier
from ftrun.controller.policy_file import FaultPolicy
from ftrun.controller.roster import HostState, NotEnoughHosts, Roster
from ftrun.controller.stall import StallWatch
from ftrun.journal import Journal
from ftrun.planner import NoLayoutFits, Profile
from ftrun.sim.baseline import Baseline, DataParallelOnly
from ftrun.sim.charges import Charges
from ftrun.sim.clock import EventClock
from ftrun.sim.costs import Costs
from ftrun.sim.quiet import Quiet
from ftrun.sim.trace import Trace, TraceEvent
from ftrun.sim.training import Training

PROGRESS_EVERY_S = 60.0  # a simulated job's progress events: enough for a rate, not per second


class Simulation:
    def __init__(
        self,
        trace: Trace,
        *,
        config: LaunchConfig,
        costs: Costs,
        journal_for: Callable[[Callable[[], float]], Journal],
        profile: Profile | None = None,
        baseline: Baseline | None = None,
        start_s: float = 0.0,
        end_s: float,
        start_wall_t: float = 1.8e9,
    ) -> None:
        self.trace, self.config, self.costs, self.baseline = trace, config, costs, baseline
        self.charges = Charges(costs, baseline)
        self.start_s, self.end_s = start_s, end_s
        self.clock = EventClock(start_s)
        self.at = self.clock.at
        self.wall0 = start_wall_t - start_s  # the journal's times: the job starts at start_wall_t
        self.journal = journal_for(lambda: self.wall0 + self.t)
        self.roster = Roster(config.hosts, min_nodes=config.min_nodes, max_nodes=config.max_nodes)
        policy = FaultPolicy()
        self.incidents = Incidents(
            config, rules=policy.rules, health=HostHealth(policy.quarantine), journal=self.journal
        )
        desk = PlanDesk if baseline is None else DataParallelOnly
        self.plans: PlanDesk | Unplanned = (
            desk(config, profile, journal=self.journal, reporter=Quiet(), clock=self.clock.now)
            if profile is not None
            else Unplanned()
        )
        self.watch: GenWatch | None = None
        self.generation = 0
        self.phase = "down"  # down | launching | training | ending
        full_world = (config.max_nodes or len(config.hosts)) * config.nproc_per_node
        self.training = Training(self.charges, full_world=full_world)
        self.first_launch = False
        self.waiting = False  # too few hosts: the next generation waits for one to come
        self.done = False

    @property
    def t(self) -> float:
        """Seconds since the trace's start, on the simulated clock."""
        return self.clock.t

    # ---- the job's start and end -----------------------------------------------------------

    def run(self) -> None:
        """Start the job with the hosts up at the trace's start and follow the trace to its
        end; the job is then stopped, as `ftrun replay` stops it."""
        for e in self.trace.events:
            if self.start_s < e.t_s < self.end_s:
                self.at(e.t_s, functools.partial(self.on_trace, e))
        self.at(self.end_s, self.stop)
        self.start()
        self.clock.run(until=lambda: self.done)

    def start(self) -> None:
        cfg = self.config
        self.journal.record(
            "job_started",
            job_id=cfg.job_id,
            name=cfg.job_name,
            hosts=list(cfg.hosts),
            spares=[],
            min_nodes=cfg.min_nodes,
            max_nodes=self.roster.want,
            nproc_per_node=cfg.nproc_per_node,
            max_restarts=cfg.max_restarts,
            entrypoint=["(simulated)"],
            run=1,
            simulated=True,
        )
        for host in cfg.hosts:
            self.start_agent(host)
        self.at(self.t + self.costs.agent_start_s, self.next_generation)
        self.first_launch = True

    def stop(self) -> None:
        """The trace is over: stop the job as Ctrl-C does (SIGTERM, grace, exit)."""
        if self.phase == "training":
            self.progress()
        if self.watch is not None:
            self.journal.record("stop_requested", gen=self.generation)
            step = self.step()
            self.clock.t += self.costs.stop_s  # ranks, then agents, stopped
            self.journal.record("generation_ended", gen=self.generation, outcome="stopped",
                                step=step)  # fmt: skip
        self.journal.record(
            "job_finished", state="stopped", exit_code=0, reason="the trace ended",
            root_cause=None, restarts=self.incidents.restarts, generation=self.generation,
        )  # fmt: skip
        self.done = True

    # ---- hosts -----------------------------------------------------------------------------

    def on_trace(self, e: TraceEvent) -> None:
        if e.action == "add":
            self.host_added(e.node)
        else:
            self.host_gone(e.node)

    def host_added(self, host: str) -> None:
        """`ftrun hosts add`: new, or back after it was lost (fleet.request)."""
        if host in self.roster.slots and self.roster.state(host) not in (
            HostState.LOST,
            HostState.REMOVED,
        ):
            return
        self.roster.add(host)
        self.journal.record("host_added", host=host)
        self.start_agent(host)

    def start_agent(self, host: str) -> None:
        agent_id = self.roster.new_agent(host)
        self.at(self.t + self.costs.agent_start_s, lambda: self.agent_ready(agent_id))

    def agent_ready(self, agent_id: str) -> None:
        if not self.roster.ready(agent_id):
            return  # the host went away meanwhile
        self.journal.record("agent_connected", host=self.roster.host_of(agent_id), agent=agent_id)
        if self.phase == "training":
            self.maybe_reconfigure()
        elif self.waiting:
            self.next_generation()  # too few hosts: one came

    def host_gone(self, host: str) -> None:
        """A spot reclaim: every process of the host dies, without warning."""
        slot = self.roster.slots.get(host)
        if slot is None or slot.state in (HostState.LOST, HostState.REMOVED):
            return
        watch = self.watch
        active = watch is not None and host in watch.hosts.values() and self.phase != "ending"
        if not active:
            self.roster.lost(host)  # a spare, or one still starting: nothing to recover
            return
        fault_t = self.t
        step = self.step()
        self.at(self.t + self.charges.detect_s(), lambda: self.host_lost(host, fault_t, step))
        self.phase = "ending"
        self.progress(step)

    def host_lost(self, host: str, fault_t: float, step: int) -> None:
        watch = self.watch
        assert watch is not None
        watch.max_step = step
        self.roster.lost(host)
        failure = evidence.host_lost({"reason": "simulated"}, host, step)
        failure.fault_t = self.wall0 + fault_t
        failure.detected_t = self.wall0 + self.t
        self.incidents.open()
        decision = self.incidents.classify(watch, failure, now=self.t, wall_t=self.wall0 + self.t)
        incident = self.incidents.count
        self.at(
            self.t + self.charges.teardown_s(),
            lambda: self.torn_down(incident, decision.tier, failure),
        )

    def torn_down(self, incident: int, tier: Tier, failure: evidence.Failure) -> None:
        self.plans.torn_down(self.charges.teardown_s())
        self.journal.record("torn_down", incident=incident, gen=self.generation)
        self.end_generation("failed")
        if tier is Tier.FATAL:
            self.finish("failed", "a fatal fault")
            return
        self.relaunch_after(failure)

    def relaunch_after(self, failure: evidence.Failure) -> None:
        self.incidents.restarted(failure, next_gen=self.generation + 1, backoff_s=0.0)
        self.next_generation()

    # ---- generations -----------------------------------------------------------------------

    def next_generation(self) -> None:
        """Plan on the usable hosts and launch (supervisor._plan and _launch)."""
        try:
            hosts = self.roster.plan()
            used = self.plans.choose(hosts, gen=self.generation + 1, why="simulated")
        except (NotEnoughHosts, NoLayoutFits):
            # The controller would end the job here; a spot job waits for hosts to come.
            self.watch = None
            self.phase = "down"
            self.waiting = True
            return
        self.waiting = False
        self.roster.keep(used)
        self.generation += 1
        world = len(used) * self.config.nproc_per_node
        self.journal.record("generation_launched", gen=self.generation, hosts=used,
                            world_size=world)  # fmt: skip
        self.plans.launched()
        agents = [self.roster.slots[h].agent_id or h for h in used]
        self.watch = GenWatch(
            self.generation,
            set(agents),
            dict(zip(agents, used, strict=True)),
            order=agents,
            stall=StallWatch(
                set(agents), exit_timeout_s=60.0, idle_timeout_s=0.0, stacks_timeout_s=10.0
            ),  # fmt: skip
            journal=self.journal,
            reporter=Quiet(),
        )
        self.training.launched(world, getattr(self.plans, "current", None))
        self.phase = "launching"
        restore = self.costs.restore_s
        gen = self.generation
        if self.first_launch:  # the job's start: agents, rendezvous, imports, the first step
            self.first_launch = False
            delay = max(0.0, self.charges.startup_s() - self.costs.agent_start_s)
        else:
            delay = self.charges.relaunch_s()
        self.at(self.t + delay + restore, lambda: self.first_step(gen, restore))

    def first_step(self, gen: int, restore_s: float) -> None:
        if gen != self.generation or self.phase != "launching":
            return  # lost before its first step
        restored = self.restored_step()
        self.journal.record("checkpoint_restored", gen=gen, step=restored,
                            tier="storage" if restored else "none", restore_s=restore_s)  # fmt: skip
        self.training.began(self.t, step0=restored + 1)
        self.journal.record("first_step", gen=gen, step=self.training.step0)
        assert self.watch is not None
        self.watch.first_step_seen = True
        self.plans.first_step()
        self.phase = "training"
        self.at(self.t + PROGRESS_EVERY_S, lambda: self.tick(gen))
        self.maybe_reconfigure()

    def tick(self, gen: int) -> None:
        if gen == self.generation and self.phase == "training":
            self.progress()
            self.at(self.t + PROGRESS_EVERY_S, lambda: self.tick(gen))

    def maybe_reconfigure(self) -> None:
        """A ready host: grow if the plan says it pays (supervisor._reconfiguration); the
        baseline restarts on every change."""
        watch = self.watch
        assert watch is not None
        change = watch.reconfiguration(self.roster, lambda host: False)
        if change is None:
            return
        if change.why == "grow":
            joining = self.roster.can_grow()
            change = self.plans.gate(change, list(watch.hosts.values()), joining)
            if change is None:
                return
        step = self.step()
        self.progress(step)
        self.journal.record("reconfigure", gen=self.generation, why=change.why,
                            detail=change.detail, step=step)  # fmt: skip
        self.phase = "ending"
        self.at(self.t + self.charges.reconfigure_s(), self.reconfigured)

    def reconfigured(self) -> None:
        self.plans.torn_down(self.charges.reconfigure_s())
        self.end_generation("reconfigured")
        self.next_generation()

    def end_generation(self, outcome: str) -> None:
        self.journal.record("generation_ended", gen=self.generation, outcome=outcome,
                            step=self.watch.max_step if self.watch else None)  # fmt: skip
        self.watch = None
        self.phase = "down"

    def finish(self, state: str, reason: str) -> None:
        self.journal.record("job_finished", state=state, exit_code=1, reason=reason,
                            root_cause=None, restarts=self.incidents.restarts,
                            generation=self.generation)  # fmt: skip
        self.done = True

    # ---- steps and checkpoints -------------------------------------------------------------

    def step(self) -> int:
        """The step the running generation has reached (its last whole one)."""
        if self.phase not in ("training", "ending") or self.watch is None:
            return self.training.committed
        return self.training.reached(self.t)

    def progress(self, step: int | None = None) -> None:
        """A progress event, and the commits made so far: storage gets the latest step every
        persist interval (the baseline: every checkpoint interval)."""
        step = self.step() if step is None else step
        if self.phase not in ("training", "ending") or self.watch is None:
            return
        self.watch.max_step = step
        self.training.record(self.journal, t=self.t, gen=self.generation, step=step)

    def restored_step(self) -> int:
        return self.training.committed
