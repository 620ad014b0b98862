"""A job through an availability trace, in simulated time, decided by the controller's own code.

What happens when a host leaves or joins is decided by the supervisor's own job machine
(controller/job.py), driven here on the simulated clock: the hosts and DP x PP layout of each
generation (the Roster, the PlanDesk, quarantined hosts left out), each fault's tier (the fault
policy, then quarantine), the back-off after faults in a row without progress, the restart
budget, and whether a ready host is a reason to grow (a grow pays for its restart, weighed with
the switch cost the PlanDesk measures on the simulated clock). One difference, on purpose: with
too few hosts for a plan the controller ends the job, while a simulated spot job waits for
hosts to come (a trace is about what the job does as they do). Only time is not
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
from ftrun.controller.generation import Ending, GenWatch
from ftrun.controller.job import End, Relaunch
from ftrun.controller.policy import Tier
from ftrun.controller.reporting import JobOutcome
from ftrun.controller.roster import HostState
from ftrun.journal import Journal
from ftrun.planner import Profile
from ftrun.sim.baseline import Baseline
from ftrun.sim.charges import Charges
from ftrun.sim.clock import EventClock
from ftrun.sim.costs import Costs
from ftrun.sim.desks import generation_watch, job_machine
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
        self.job = job_machine(
            config,
            profile=profile,
            baseline=baseline,
            journal=self.journal,
            now=self.clock.now,
            wall=lambda: self.wall0 + self.t,
        )
        self.roster, self.plans, self.incidents = (
            self.job.roster,
            self.job.plans,
            self.job.incidents,
        )
        self.watch: GenWatch | None = None
        self.phase = "down"  # down | launching | training | ending
        full_world = (config.max_nodes or len(config.hosts)) * config.nproc_per_node
        self.training = Training(self.charges, full_world=full_world)
        self.first_launch = False
        # Too few hosts for a plan: what plans again once a host comes (a simulated spot job
        # waits for hosts where the controller would end the job).
        self.waiting: Callable[[], None] | None = None
        self.done = False

    @property
    def generation(self) -> int:
        return self.job.generation

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
        self.at(self.t + self.costs.agent_start_s, self.first_generation)
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
        elif self.waiting is not None:
            self.waiting()  # too few hosts: one came

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
        incident = self.incidents.open()
        decision = self.job.classify(watch, failure)  # as judge.py
        if decision.tier is Tier.FATAL:
            outcome = JobOutcome.failed(decision.reason, watch.root_cause(failure))
            end = Ending("failed", False, incident, outcome)
        else:
            end = Ending("failed", False, incident, why=decision.reason, failure=failure)
        self.at(self.t + self.charges.teardown_s(), lambda: self.torn_down(end, watch))

    def torn_down(self, end: Ending, watch: GenWatch) -> None:
        self.plans.torn_down(self.charges.teardown_s())
        self.journal.record("torn_down", incident=end.incident, gen=self.generation)
        self.end_generation(end.outcome)
        self.after(end, watch)

    # ---- generations (the job machine's decisions, as supervisor._supervise) ------------------

    def after(self, end: Ending, watch: GenWatch) -> None:
        """A generation is down: the job's end, or the back-off and then the next generation."""
        after = self.job.after(end)
        if isinstance(after, End):
            self.finish(after.outcome)
            return
        self.at(self.t + after.delay_s, lambda: self.relaunch(end, watch, after.delay_s))

    def relaunch(self, end: Ending, watch: GenWatch, backoff_s: float) -> None:
        decision = self.job.relaunch(end, watch, backoff_s=backoff_s)
        if isinstance(decision, Relaunch):
            self.waiting = None
            self.launch(decision.hosts)
        else:
            self.wait_for_hosts(lambda: self.relaunch(end, watch, backoff_s))

    def first_generation(self) -> None:
        first = self.job.first_plan()
        if isinstance(first, End):
            self.wait_for_hosts(self.first_generation)
        else:
            self.waiting = None
            self.launch(first)

    def wait_for_hosts(self, then: Callable[[], None]) -> None:
        """Too few hosts for a plan: the controller would end the job here; a spot job waits
        for hosts to come."""
        self.watch = None
        self.phase = "down"
        self.waiting = then

    def launch(self, hosts: list[str]) -> None:
        """Launch the next generation on `hosts` (supervisor._launch): its first step comes
        after the start-up (the job's first) or a relaunch, and the restore."""
        spec = self.job.launch(hosts)
        used = spec.hosts
        world = len(used) * self.config.nproc_per_node
        self.journal.record("generation_launched", gen=spec.number, hosts=used,
                            world_size=world)  # fmt: skip
        agents = [self.roster.slots[h].agent_id or h for h in used]
        self.watch = generation_watch(spec.number, agents, used, self.journal)
        self.training.launched(world, getattr(self.plans, "current", None))
        self.phase = "launching"
        restore = self.costs.restore_s
        gen = spec.number
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
        """A ready host: grow if the plan says it pays (the job machine, as the watcher asks it);
        the baseline restarts on every change."""
        watch = self.watch
        assert watch is not None
        change = self.job.reconfiguration(watch)
        if change is None:
            return
        step = self.step()
        self.progress(step)
        self.journal.record("reconfigure", gen=self.generation, why=change.why,
                            detail=change.detail, step=step)  # fmt: skip
        self.phase = "ending"
        end = Ending("reconfigured", True, why=change.detail)  # as judge.py
        self.at(self.t + self.charges.reconfigure_s(), lambda: self.reconfigured(end, watch))

    def reconfigured(self, end: Ending, watch: GenWatch) -> None:
        self.plans.torn_down(self.charges.reconfigure_s())
        self.end_generation(end.outcome)
        self.after(end, watch)

    def end_generation(self, outcome: str) -> None:
        self.journal.record("generation_ended", gen=self.generation, outcome=outcome,
                            step=self.watch.max_step if self.watch else None)  # fmt: skip
        self.watch = None
        self.phase = "down"

    def finish(self, outcome: JobOutcome) -> None:
        self.journal.record("job_finished", state=outcome.state.value,
                            exit_code=outcome.exit_code, reason=outcome.reason,
                            root_cause=outcome.root_cause, restarts=self.incidents.restarts,
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
