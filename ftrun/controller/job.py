"""The job's decisions, with no I/O: one machine that the supervisor awaits around and that
`ftrun simulate` drives on its own clock.

    plan ─▶ launch spec (generation n) ─▶ … the generation runs: faults classified,
                                            reconfigurations weighed …
      ▲                                                 │ it ended (judge.py's Ending)
      │                                                 ▼
      └── Relaunch(hosts) ◀── plan again ◀── BackOff(s) ◀── after(ending) ──▶ End(outcome)

What it decides: the generation number, the hosts and DP x PP layout of each one (the roster, the
plan desk, quarantine left out), what a generation's ranks are launched with (hang policy,
restart count, plan and restore environment), each fault's tier and the restart budget
(incidents.py, host_health.py), whether a ready host is a reason to grow, and after a generation
ends: the job's end, or a back-off and then the next generation's hosts.

What it does not do: talk to agents, wait, read a clock of its own. The caller passes the clocks
(`now`: monotonic, for quarantine windows; `wall`: for the journal's dates), waits out a
`BackOff` however it keeps time (the supervisor on the event loop, with Ctrl-C; the simulator on
its event clock), and launches, tears down and reports. It journals, through the Journal it is
given: the simulator's writes simulated times, so `inspect` reads a simulated job as a real one.
That the two drivers cannot drift apart is the point: tests/unit/test_job.py drives it alone,
tests/unit/test_sim.py through the simulator, and the replay test compares a simulated trace's
decisions with a real run of it (jobview/decisions.py).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ftrun.config import LaunchConfig
from ftrun.controller.evidence import Failure
from ftrun.controller.generation import Ending, GenWatch, Reconfigure
from ftrun.controller.host_health import HostHealth
from ftrun.controller.incidents import Incidents
from ftrun.controller.planning import PlanDesk, Unplanned
from ftrun.controller.policy import Decision
from ftrun.controller.policy_file import FaultPolicy
from ftrun.controller.reporting import JobOutcome
from ftrun.controller.roster import HostState, NotEnoughHosts, Roster
from ftrun.journal import Journal
from ftrun.planner import NoLayoutFits


@dataclass(frozen=True)
class LaunchSpec:
    """What generation `number` is launched with: its hosts, by node rank, and what its ranks
    are told (the hang policy's fields, the restart count, the environment of plan and restore)."""

    number: int
    hosts: list[str]
    hang: dict[str, Any]
    restarts: int
    env: dict[str, str]


@dataclass(frozen=True)
class End:
    """The job ends with `outcome`; `notice` (text, level) is said first when there is one."""

    outcome: JobOutcome
    notice: tuple[str, str] | None = None


@dataclass(frozen=True)
class BackOff:
    """Wait `delay_s` (0: none) before planning the next generation: faults in a row without
    progress back off exponentially (policy.backoff_s)."""

    delay_s: float


@dataclass(frozen=True)
class Relaunch:
    """The next generation runs on `hosts`; `notices` (text, level) say what changed."""

    hosts: list[str]
    notices: list[tuple[str, str]]


class JobMachine:
    def __init__(
        self,
        config: LaunchConfig,
        *,
        policy: FaultPolicy,
        roster: Roster,
        plans: PlanDesk | Unplanned,
        incidents: Incidents,
        health: HostHealth,
        journal: Journal,
        now: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        quarantined: Callable[[str, float, str, int], None] | None = None,
    ) -> None:
        self.config, self.policy, self.journal = config, policy, journal
        self.roster, self.plans, self.incidents, self.health = roster, plans, incidents, health
        self.now, self.wall = now, wall
        # Told (host, until wall time, why, failures) of each quarantine this job decides: the supervisor
        # keeps them in the user's store (ftrun/quarantine.py); a simulation does not.
        self.quarantined = quarantined
        self.unfit: dict[str, str] = {}  # hosts left out by the checks (host_checks.py): why
        self.generation = 0  # the last one launched

    # ---- plans --------------------------------------------------------------------------------

    def excluded(self) -> Callable[[str], bool]:
        """Quarantined now, or left out by the host checks: not planned, not grown onto."""
        quarantined = self.health.excluded(self.now())
        return lambda host: host in self.unfit or quarantined(host)

    def leave_out(self, host: str, why: str) -> None:
        """The host checks found `host` unfit (other versions than the job's): left out of every
        plan until `let_in`."""
        self.unfit[host] = why
        self.journal.record("host_left_out", host=host, reason=why)

    def let_in(self, host: str) -> None:
        if self.unfit.pop(host, None) is not None:
            self.journal.record("host_released", host=host, why="its checks pass")

    def plan(self, why: str) -> list[str]:
        """The next generation's hosts; in a planned job, those its DP x PP layout uses (the rest
        wait as spares). Raises NotEnoughHosts or NoLayoutFits."""
        hosts = self.roster.plan(excluded=self.excluded())
        used = self.plans.choose(hosts, gen=self.generation + 1, why=why)
        self.roster.keep(used)
        return used

    def first_plan(self) -> list[str] | End:
        """The first generation's hosts, or the job's end when they cannot run it."""
        try:
            return self.plan("launch")
        except NotEnoughHosts as e:
            return End(JobOutcome.failed(e.explain("cannot start"), {"hint": e.hint}))
        except NoLayoutFits as e:
            return End(JobOutcome.failed(f"cannot start: {e.message}", {"hint": e.hint}))

    def launch(self, hosts: list[str]) -> LaunchSpec:
        """The next generation: its number and what its ranks are launched with. A job whose
        ranks ever stepped expects progress from then on (a silent rank is then a hang)."""
        self.generation += 1
        hang = self.policy.hang
        expect = hang.expect_progress or bool(self.config.progress_regex)
        hang = dataclasses.replace(hang, expect_progress=expect or self.incidents.ever_progressed)
        self.plans.launched()
        return LaunchSpec(
            self.generation,
            list(hosts),
            dataclasses.asdict(hang),
            self.incidents.relaunches,
            {**self.plans.rank_env(), **self.incidents.rank_env()},
        )

    def unbench(self, host: str) -> None:
        """The user added `host` again (`ftrun hosts add`): its quarantine in this job ends."""
        if self.health.until.pop(host, None) is not None:
            self.health.failures.pop(host, None)
            self.journal.record("host_released", host=host, why="ftrun hosts add")

    # ---- while a generation runs --------------------------------------------------------------

    def classify(self, watch: GenWatch, failure: Failure) -> Decision:
        """A fault that ended `watch`: journaled, its tier decided (policy, then quarantine)."""
        before = set(self.health.until)
        now, wall = self.now(), self.wall()
        decision = self.incidents.classify(watch, failure, now=now, wall_t=wall)
        for host in set(self.health.until) - before:
            if self.quarantined is not None:
                until_t = wall + self.health.until[host] - now
                n, window = self.health.recent_failures(host), self.health.policy.window_s
                why = f"{n} failures within {window:g} s, the last: {failure.evidence.describe()}"
                self.quarantined(host, until_t, why, n)
        return decision

    def bench(self, host: str, until_t: float, why: str) -> None:
        """Quarantine `host` until wall time `until_t`, as another job decided (the user's
        store): not planned, not grown onto, until then. Journaled for `inspect`."""
        self.health.until[host] = self.now() + until_t - self.wall()
        self.journal.record("host_quarantined", host=host, until_t=until_t, reason=why,
                            from_store=True)  # fmt: skip

    def reconfiguration(self, watch: GenWatch) -> Reconfigure | None:
        """A host removed, or ready hosts to grow onto (quarantined ones are not); in a planned
        job, a grow only when the better plan pays for its restart (planning.py)."""
        change = watch.reconfiguration(self.roster, self.excluded())
        if change is None or change.why != "grow":
            return change
        joining = self.roster.can_grow(excluded=self.excluded())
        return self.plans.gate(change, list(watch.hosts.values()), joining)

    def on_straggler(self, host: str, ratio: float, hosts: list[str]) -> Reconfigure | None:
        """`host` of a generation on `hosts` was named a straggler, `ratio` x the median's
        compute a step. Report only, or (--stragglers replace|drop) a restart without it when
        the time that saves over --replan-horizon exceeds the restart's measured cost: the rule
        a grow follows. The host is then quarantined (its expiry: the policy's)."""
        how = self.config.stragglers
        if how == "report" or host not in hosts:
            return None
        excluded = self.excluded()
        ready = [
            h for h in self.roster.in_state(HostState.READY) if h not in hosts and not excluded(h)
        ]
        spare = how == "replace" and bool(ready)
        n = len(hosts)
        if how == "replace" and not spare:
            return self._kept(host, "no spare host is ready to take its place")
        if how == "drop" and not ready and n - 1 < self.config.min_nodes:
            return self._kept(host, "without it the job has fewer than --min-nodes hosts")
        # Every step waits for the straggler: without it the pace is the median's, on one host
        # fewer when it is dropped without a spare (the global batch kept).
        speedup = ratio if spare or ready else ratio * (n - 1) / n
        horizon, cost = self.config.replan_horizon_s, self.plans.switch_cost_s()
        saved = horizon * (1 - 1 / speedup) if speedup > 1 else 0.0
        if saved <= cost:
            return self._kept(host, f"{saved:.0f} s saved over --replan-horizon {horizon:g} s "
                                    f"does not pay a restart of {cost:.0f} s")  # fmt: skip
        why = (f"{host} is a straggler ({ratio:.1f}x): "
               f"{'replaced by a spare' if spare or ready else 'dropped'}, saving {saved:.0f} s "
               f"over --replan-horizon for a restart of {cost:.0f} s")  # fmt: skip
        now, wall = self.now(), self.wall()
        self.health.until[host] = now + self.health.policy.expiry_s
        self.journal.record("host_quarantined", host=host, until_t=wall + self.health.policy.expiry_s,
                            reason=why)  # fmt: skip
        if self.quarantined is not None:
            self.quarantined(host, wall + self.health.policy.expiry_s, why, 0)
        return Reconfigure("straggler", why)

    def _kept(self, host: str, why: str) -> Reconfigure | None:
        """The straggler stays (journaled with why): no restart."""
        self.journal.record("straggler_kept", host=host, reason=why)
        return None

    # ---- after a generation -------------------------------------------------------------------

    def after(self, end: Ending) -> End | BackOff:
        """What follows a generation once it is torn down: the job's end, or a wait (0 s but
        after faults in a row without progress) before the next generation is planned."""
        if end.job is not None:
            return End(end.job)
        return BackOff(self.incidents.backoff_s() if end.failure is not None else 0.0)

    def relaunch(self, end: Ending, watch: GenWatch, *, backoff_s: float) -> Relaunch | End:
        """The next generation's hosts, planned only now (hosts may have been lost, or come back,
        while the last one went down and the back-off was waited out); after a fault, the
        restart is charged to the budget. The job ends when no plan fits."""
        try:
            hosts = self.plan(end.why)
        except (NotEnoughHosts, NoLayoutFits) as e:
            reason = e.explain(end.why) if isinstance(e, NotEnoughHosts) else f"{end.why}; {e}"
            if end.failure is None:
                return End(JobOutcome.failed(reason))
            return End(
                JobOutcome.failed(reason, watch.root_cause(end.failure)),
                (f"fatal: {reason}", "error"),
            )
        notices: list[tuple[str, str]] = []
        if end.failure is not None:
            if (changed := self._hosts_changed(list(watch.hosts.values()), hosts)) is not None:
                notices.append((changed, "warning"))
            incidents = self.incidents
            incidents.restarted(end.failure, next_gen=self.generation + 1, backoff_s=backoff_s)
            # After a back-off the fault was said already, with the wait: not a second failure.
            said = f"back-off of {backoff_s:g} s over" if backoff_s else end.why
            notices.append((f"{said} ({incidents.budget_note(end.failure)})", "warning"))
        return Relaunch(hosts, notices)

    def _hosts_changed(self, before: list[str], hosts: list[str]) -> str | None:
        """Journal a fault's change of hosts (replaced or shrunk); what to tell the user."""
        gone = [h for h in before if h not in hosts]
        new = [h for h in hosts if h not in before]
        if not gone and not new:
            return None
        how = "replaced" if len(hosts) >= len(before) else "shrunk"
        self.journal.record(
            "hosts_changed",
            incident=self.incidents.count,
            how=how,
            removed=gone,
            added=new,
            hosts=hosts,
            nodes_before=len(before),
            nodes_after=len(hosts),
        )
        change = f"{', '.join(gone)} → {', '.join(new)}" if new else f"without {', '.join(gone)}"
        return f"{how}: {change} ({len(hosts)} host(s))"
