"""The controller's side of the DP x PP planner: which layout each generation runs, on which of
the hosts the roster offers, and whether growing onto ready hosts is worth a restart.

The planner (ftrun/planner/) is pure and knows nothing of hosts' names or of time passing; this
desk feeds it the hosts at hand (every host runs `nproc_per_node` ranks, so a layout uses whole
hosts), keeps the plan of the running generation, measures what a switch costs here (the last
teardown plus the last start-up to the first step), and journals every choice (`plan_chosen`,
with the alternatives it beat) and every grow it declined (`grow_declined`, once per offer).
It learns (plan_learning.py): each plan's measured step time calibrates the predictions
(planner/calibrate.py), and plans are ranked and grows weighed on the calibrated figures.
The plan reaches the ranks as $FTRUN_PLAN (docs/planner.md), where ftrun.parallel builds it.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ftrun import envcontract
from ftrun.config import LaunchConfig
from ftrun.controller.generation import Reconfigure
from ftrun.controller.plan_learning import PlanLearner
from ftrun.controller.reporting import Reporter
from ftrun.errors import FtrunError
from ftrun.journal import Journal
from ftrun.planner import (
    Layout,
    Profile,
    SwitchDecision,
    best_layout,
    prefer_current_pp,
    rank_layouts,
    should_switch,
)
from ftrun.planner.calibrate import Calibration, Factor, measured_links

PROFILE_FILE = "profile.json"  # the job's copy of its profile, in the job directory
ALTERNATIVES_JOURNALED = 4
# Until a switch has been measured in this job: a guess on the side of not switching.
UNMEASURED_SWITCH_S = 30.0
# A layout with the current pipeline depth within this share of the best is kept: the same
# stages mean no reshard of the pipeline, and a near tie is not worth changing the shape for.
KEEP_PP_WITHIN = 0.05


def load_profile(job_dir: Path) -> Profile:
    """The job's copy of its profile (the launcher put it there, checked)."""
    path = job_dir / PROFILE_FILE
    try:
        return Profile.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError) as e:
        raise FtrunError(
            f"the job's profile {path} cannot be read: {e}",
            hint="launch again with --profile FILE (made by `ftrun profile`)",
        ) from None


class SwitchCost:
    """What a restart costs on this job's hosts, measured (a grow and a straggler's eviction
    must pay it back): the last teardown plus the last start-up to a first step."""

    clock: Callable[[], float]  # monotonic; the simulator's own
    _launched_at: float | None = None
    _startup_s: float | None = None
    _teardown_s: float | None = None

    def launched(self) -> None:
        self._launched_at = self.clock()

    def first_step(self) -> None:
        if self._launched_at is not None:
            self._startup_s = self.clock() - self._launched_at
            self._launched_at = None

    def torn_down(self, seconds: float) -> None:
        self._teardown_s = seconds

    def switch_cost_s(self) -> float:
        if self._startup_s is None:
            return UNMEASURED_SWITCH_S
        return self._startup_s + (self._teardown_s or 0.0)


class PlanDesk(SwitchCost):
    def __init__(
        self,
        config: LaunchConfig,
        profile: Profile,
        *,
        journal: Journal,
        reporter: Reporter,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.profile = profile
        self.journal = journal
        self.reporter = reporter
        self.clock = clock
        self.global_batch = config.global_batch or profile.global_batch or 0
        self.device_memory_bytes = config.device_memory_bytes or profile.device_memory_bytes
        self.current: Layout | None = None
        self._declined: set[tuple[str, ...]] = set()
        self._full: list[Layout] | None = None  # the layouts on all the hosts the job wants
        self.calibration = Calibration()  # empty (the model as it is) until learn()
        self.learning: PlanLearner | None = None
        self._links_measured = False

    def learn(self) -> None:
        """Calibrate with what this job measures, and take the link check's figures (the
        controller's desk; the simulator's predicts from the model alone)."""
        self.learning = PlanLearner(self.journal, self.calibration)

    # ---- choosing -----------------------------------------------------------------------------

    def ranked(self, n_hosts: int) -> list[Layout]:
        """Every layout that fits on `n_hosts` whole hosts, fastest first (may be empty)."""
        return rank_layouts(self.profile, **self._cluster(n_hosts))

    def best(self, n_hosts: int, ranked: list[Layout] | None = None) -> Layout:
        """The layout for `n_hosts` hosts (`ranked`: their layouts, if ranked already): the
        fastest as calibrated, unless one with the running pipeline depth is nearly as fast.
        Raises the planner's NoLayoutFits, which says why. Returns the model's layout."""
        if ranked is None:
            ranked = self.ranked(n_hosts)
        if not ranked:
            return best_layout(self.profile, **self._cluster(n_hosts))  # raises: nothing fits
        pairs = self.calibration.rank(ranked)
        if self.current is None:
            return pairs[0][1]
        pick = prefer_current_pp([c for c, _ in pairs], self.current.pp, within=KEEP_PP_WITHIN)
        return next(model for calibrated, model in pairs if calibrated is pick)

    def predicted(self, layout: Layout) -> tuple[float, Factor]:
        """`layout`'s calibrated step time, and the factor that made it."""
        factor = self.calibration.factor(layout)
        return layout.step_s * factor.value, factor

    def _take_measured_links(self) -> None:
        links = self.learning.links if self.learning is not None else None
        if links is None or self._links_measured:
            return
        self._links_measured = True
        figures = measured_links(self.profile.links, latency_s=links[0], bandwidth_Bps=links[1])
        self.profile = dataclasses.replace(self.profile, links=figures)
        self._full = None

    def _cluster(self, n_hosts: int) -> dict[str, Any]:
        nproc = self.config.nproc_per_node
        return {
            "slots": [nproc] * n_hosts,
            "global_batch": self.global_batch,
            "device_memory_bytes": self.device_memory_bytes,
            "granularity": nproc,  # torchrun starts nproc ranks on every host of a generation
        }

    def choose(self, hosts: list[str], *, gen: int, why: str) -> list[str]:
        """The next generation's layout on (a prefix of) `hosts`, journaled; returns the hosts
        it runs on (the rest wait as spares)."""
        if self.learning is not None:
            self.learning.finish()  # the generation that ends is learned before planning on
        self._take_measured_links()
        ranked = self.ranked(len(hosts))  # once: on the recovery path, and seconds at scale
        layout = self.best(len(hosts), ranked)
        used = hosts[: layout.slots_used // self.config.nproc_per_node]
        before = self.current
        self.current = layout
        self._declined.clear()  # a new generation weighs every offer again
        predicted, factor = self.predicted(layout)
        if self.learning is not None:
            self.learning.start(gen, layout, summary(layout))
        self.journal.record(
            "plan_chosen",
            gen=gen,
            why=why,
            hosts=used,
            spare_hosts=hosts[len(used) :],
            layout=layout.to_plan(),
            summary=summary(layout),
            predicted_step_s=predicted,
            model_step_s=layout.step_s,
            calibration={"factor": round(factor.value, 4), "source": factor.source},
            links=dataclasses.asdict(self.profile.links) | {"measured": self._links_measured},
            full_step_s=self.full_step_s(len(hosts), ranked),
            previous=summary(before) if before is not None else None,
            alternatives=[
                {"summary": summary(alt), "predicted_step_s": self.predicted(alt)[0]}
                for _, alt in self.calibration.rank(ranked)
                if alt is not layout
            ][:ALTERNATIVES_JOURNALED],
        )
        if before is None or summary(before) != summary(layout):
            self.reporter.notice(
                f"plan: {summary(layout)} on {len(used)} host(s), "
                f"{predicted:.3g} s/step predicted ({why})"
            )
        return used

    def full_step_s(self, n_hosts: int, ranked: list[Layout]) -> float | None:
        """The predicted step of the best layout on all the hosts the job wants (--max-nodes, else
        its launch hosts): what goodput's "smaller plan" compares each generation's plan against.
        Ranked once per job (`ranked` is reused when the plan is for that many hosts), each time
        calibrated as the plan is."""
        if self._full is None:
            want = self.config.max_nodes or len(self.config.hosts)
            self._full = ranked if n_hosts == want else self.ranked(want)
        if not self._full:
            return None
        return self.calibration.rank(self._full)[0][0].step_s

    def rank_env(self) -> dict[str, str]:
        """What every rank of the next generation gets: its plan."""
        assert self.current is not None, "choose() before launching"
        return {envcontract.PLAN: json.dumps(self.current.to_plan(), separators=(",", ":"))}

    # ---- growing ------------------------------------------------------------------------------

    def gate(
        self, change: Reconfigure, active: list[str], joining: list[str]
    ) -> Reconfigure | None:
        """A grow onto `joining` hosts goes ahead only when the better plan pays for its
        restart; other changes (a host removed) always do."""
        if change.why != "grow":
            return change
        decision = self.worth_growing(active, joining)
        return Reconfigure("grow", decision.reason) if decision is not None else None

    def worth_growing(self, active: list[str], joining: list[str]) -> SwitchDecision | None:
        """Whether a generation on `active` + `joining` pays for its restart; None when it
        does not (journaled once per offer, so a host that stays ready is not logged per step)."""
        offer = tuple(joining)
        if self.current is None or offer in self._declined:
            return None  # decided for this generation already: no planning on every step
        if self.learning is not None:
            if self.learning.waiting():
                return None  # weighed once the running plan's steps are steady (a few steps)
            self.learning.current()  # its factor from its latest steps
        ranked = self.ranked(len(active) + len(joining))
        if not ranked:
            self._declined.add(offer)
            return None
        candidate, model = self.calibration.rank(ranked)[0]
        if candidate.same_plan(self.current) and not ranked[0].same_plan(self.current):
            # Calibrated, the running plan is the best: weigh (and say why not) the model's.
            candidate, model = self.calibration.apply(ranked[0]), ranked[0]
        decision = should_switch(
            self.calibration.apply(self.current),
            candidate,
            switch_cost_s=self.switch_cost_s(),
            horizon_s=self.config.replan_horizon_s,
        )
        decision = dataclasses.replace(decision, reason=decision.reason + self._basis(model))
        if decision.switch:
            return decision
        self._declined.add(offer)
        if candidate.same_plan(self.current):
            return None  # hosts the plan itself left as spares: nothing was offered
        self.journal.record(
            "grow_declined",
            hosts=list(joining),
            candidate=summary(candidate),
            predicted_step_s=candidate.step_s,
            reason=decision.reason,
        )
        return None

    def _basis(self, candidate: Layout) -> str:
        """What the figures of a grow's decision stand on, when the model was calibrated."""
        assert self.current is not None
        if not self.calibration.measured:
            return ""
        now, then = self.calibration.factor(self.current), self.calibration.factor(candidate)
        return (
            f" (calibrated: {summary(self.current)} {now.source} x{now.value:.2f}, "
            f"{summary(candidate)} {then.source} x{then.value:.2f})"
        )


class Unplanned(SwitchCost):
    """A job without --profile: every host the roster offers runs nproc ranks of data
    parallelism, as torchrun would; nothing is planned, journaled or gated (what a restart
    costs is measured all the same)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock

    def choose(self, hosts: list[str], *, gen: int, why: str) -> list[str]:
        return hosts

    def rank_env(self) -> dict[str, str]:
        return {}

    def gate(self, change: Reconfigure, active: list[str], joining: list[str]) -> Reconfigure:
        return change


def plan_desk(
    config: LaunchConfig, *, journal: Journal, reporter: Reporter
) -> PlanDesk | Unplanned:
    if not config.planned:
        return Unplanned()
    desk = PlanDesk(config, load_profile(journal.job_dir), journal=journal, reporter=reporter)
    desk.learn()
    return desk


def summary(layout: Layout) -> str:
    """`DP2×PP2 1F1B m4×M6`: how people read a layout."""
    return f"{layout.name} {layout.schedule} m{layout.micro_batch}×M{layout.micro_batches}"
