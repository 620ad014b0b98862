"""The job's faults, one incident each: journaled, classified against what came before (the
fault policy, then quarantine on top), and counted against the restart budget.

The supervisor tears generations down and relaunches them; this module makes the decisions and
keeps the history they need: restarts used, the previous fault, whether the job ever stepped,
and how many faults in a row came without progress (the backoff grows with those).
"""

from __future__ import annotations

from ftrun import envcontract
from ftrun.config import LaunchConfig
from ftrun.controller.evidence import HOST_LOST, Evidence, Failure
from ftrun.controller.generation import GenWatch
from ftrun.controller.host_health import HostHealth
from ftrun.controller.policy import (
    RESTORE_REJECTED,
    Decision,
    History,
    Rule,
    Tier,
    backoff_s,
    classify,
)
from ftrun.journal import Journal


class Incidents:
    def __init__(
        self, config: LaunchConfig, *, rules: tuple[Rule, ...], health: HostHealth, journal: Journal
    ) -> None:
        self.config = config
        self.rules = rules
        self.health = health
        self.journal = journal
        self.count = 0
        self.restarts = 0  # charged to --max-restarts: every restart but a lost host's
        self.replacements = 0  # restarts after a host was lost: the machine's doing, not the job's
        self.ever_progressed = False
        self.previous: Evidence | None = None  # the last fault's evidence, once restarted
        self.failures_in_row = 0  # without progress in between
        self.previous_restored: int | None = None  # the step the previous fault's gen restored
        # Set by a restore_rejected incident: the ranks restore no checkpoint of this step or
        # later (FTRUN_RESTORE_BEFORE), until a generation gets past it.
        self.restore_before: int | None = None

    def open(self) -> int:
        """A new incident (a fault, or ranks hung at exit); its number."""
        self.count += 1
        return self.count

    def classify(self, watch: GenWatch, failure: Failure, *, now: float, wall_t: float) -> Decision:
        """Journal the fault that ended `watch` and decide its tier. `now` is monotonic (the
        quarantine window); `wall_t` dates a quarantine's end for people."""
        ev, previous, incident = failure.evidence, self.previous, self.count
        failure.attribute_injection(watch.injected)
        progressed = watch.max_step is not None and (
            previous is None or previous.step is None or watch.max_step > previous.step
        )
        self.ever_progressed |= watch.first_step_seen
        if self.restore_before is not None and (watch.max_step or 0) > self.restore_before:
            self.restore_before = None  # past the rejected step: its checkpoints are new ones
        self.journal.record(
            "fault_detected",
            incident=incident,
            gen=watch.number,
            fault=ev.kind,
            host=ev.host,
            rank=ev.rank,
            fault_t=failure.fault_t,
            detected_t=failure.detected_t,
            exit_code=ev.exit_code,
            signal=ev.signal,
            step=ev.step,
            exception=ev.exception,
            **failure.detail,
        )
        clean = watch.stall.clean
        decision = classify(
            ev,
            History(
                restarts_used=self.restarts,
                ever_progressed=self.ever_progressed,
                previous=previous,
                progressed_since_previous=progressed,
                work_done_by=clean[0] if clean else None,
                restored_step=watch.restored_step,
                previous_restored_step=self.previous_restored,
            ),
            max_restarts=self.config.max_restarts,
            rules=self.rules,
        )
        benched: list[dict[str, object]] = []
        if decision.rule != RESTORE_REJECTED:  # that one is the checkpoint's doing, not the host's
            decision, benched = self.health.judge(ev, decision, now=now, wall_t=wall_t)
        for fields in benched:
            self.journal.record("host_quarantined", **fields)
        self.journal.record(
            "fault_classified",
            incident=incident,
            tier=decision.tier.value,
            decision="stop" if decision.tier is Tier.FATAL else "restart",
            rule=decision.rule,
            reason=decision.reason,
        )
        if decision.restore_before is not None and decision.tier is not Tier.FATAL:
            self.restore_before = decision.restore_before
            self.journal.record(
                "restore_rejected",
                incident=incident,
                gen=watch.number,
                step=decision.restore_before,
                reason=decision.reason,
            )
        self.previous_restored = watch.restored_step
        self.failures_in_row = 1 if progressed else self.failures_in_row + 1
        return decision

    def rank_env(self) -> dict[str, str]:
        """What the next generation's ranks must know of the incidents: a rejected restore."""
        if self.restore_before is None:
            return {}
        return {envcontract.RESTORE_BEFORE: str(self.restore_before)}

    def backoff_s(self) -> float:
        """How long to wait before the restart that follows the last fault."""
        return backoff_s(
            self.failures_in_row, base_s=self.config.backoff_base_s, cap_s=self.config.backoff_cap_s
        )

    def restarted(self, failure: Failure, *, next_gen: int, backoff_s: float) -> None:
        """The fault's restart is planned. It uses up one of the budget, unless a host was lost:
        a spot reclaim or a dead machine is not the job failing, and a day of them must not
        leave a job that then crashes once with no restart left (torchrun's elastic agent does
        not count a change of membership either)."""
        charged = failure.evidence.kind != HOST_LOST
        if charged:
            self.restarts += 1
        else:
            self.replacements += 1
        self.previous = failure.evidence
        self.journal.record(
            "restart",
            incident=self.count,
            next_gen=next_gen,
            backoff_s=backoff_s,
            restarts=self.restarts,
            charged=charged,
        )

    @property
    def relaunches(self) -> int:
        """Restarts of every kind so far (what a rank sees as TORCHELASTIC_RESTART_COUNT)."""
        return self.restarts + self.replacements

    def budget_note(self, failure: Failure) -> str:
        """What the restart after `failure` did to the budget, for the console."""
        if failure.evidence.kind == HOST_LOST:
            return "a lost host: not counted against --max-restarts"
        return f"restart {self.restarts}/{self.config.max_restarts}"
