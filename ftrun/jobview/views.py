"""What `status` and `inspect` show of a job: its generations and incidents, as plain dataclasses.

Filled in by `ftrun.jobview.fold` from the journal and by `ftrun.jobview.load` from the rank logs;
read by the CLI's renderers. Derived numbers (time to detect and recover, steps lost) are
computed here, from the times folded in, so that tables and `--json` agree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftrun.jobview.goodput_fold import GoodputFold
from ftrun.jobview.pace_fold import PaceFold
from ftrun.jobview.ranks import RankView
from ftrun.jobview.series import Series

STATES = ("running", "succeeded", "failed", "stopped")


@dataclass
class Incident:
    id: int
    generation: int
    kind: str
    host: str | None
    rank: int | None
    fault_t: float | None
    detected_t: float
    tier: str | None = None
    decision: str | None = None
    reason: str | None = None
    exit_code: int | None = None
    signal: str | None = None
    step_at_fault: int | None = None
    exception: str | None = None
    traceback: str | None = None
    traceback_source: str | None = None  # "error file" (torch's @record) or "log"
    tail: list[str] = field(default_factory=list)
    rule: str | None = None
    injected: str | None = None
    allowance_s: float | None = None
    past_allowance_s: float | None = None
    section: str | None = None
    stacks: dict[str, str] | None = None
    states: dict[str, str] | None = None
    idle_s: float | None = None  # a hang found by the idle guard: how long all were idle
    clean_rank: int | None = None  # exit_hang: the rank that exited 0 first
    stacks_missing_from: list[str] = field(default_factory=list)  # hosts that sent no stacks
    torn_down_t: float | None = None
    taken_over_t: float | None = None  # a standby's takeover: its controller came up
    relaunched_t: float | None = None
    next_generation: int | None = None
    first_step_t: float | None = None
    step_resumed: int | None = None
    restored_step: int | None = None  # what the relaunched ranks restored (from their logs)
    restored_tier: str | None = None  # "memory", "storage" or "none"
    # A restore_rejected incident: the step whose restore was rejected (the relaunch restores
    # an older checkpoint), and why the relaunch's ranks skipped newer candidates.
    restore_rejected: int | None = None
    restore_skipped: list[str] = field(default_factory=list)

    @property
    def detected_s(self) -> float | None:
        return None if self.fault_t is None else max(0.0, self.detected_t - self.fault_t)

    @property
    def recovered_s(self) -> float | None:
        if self.first_step_t is None:
            return None
        start = self.fault_t if self.fault_t is not None else self.detected_t
        return max(0.0, self.first_step_t - start)

    @property
    def lost_steps(self) -> int | None:
        # Steps done again: the run reached step_at_fault and restarts after the step it restored
        # (else, for scripts without ftrun.checkpoint, at the first step it reported again).
        if self.step_at_fault is None:
            return None
        if self.restored_step is not None:
            return max(0, self.step_at_fault - self.restored_step)
        if self.step_resumed is None:
            return None
        return max(0, self.step_at_fault - self.step_resumed + 1)

    def phases(self) -> list[tuple[str, float | None]]:
        return [
            ("fault", self.fault_t),
            ("detected", self.detected_t),
            # A standby's takeover tears nothing down: its point there is the new controller.
            ("taken over", self.taken_over_t)
            if self.taken_over_t is not None
            else ("torn down", self.torn_down_t),
            ("relaunched", self.relaunched_t),
            ("first step again", self.first_step_t),
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "generation": self.generation,
            "kind": self.kind,
            "tier": self.tier,
            "decision": self.decision,
            "reason": self.reason,
            "host": self.host,
            "rank": self.rank,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "detected_s": _round(self.detected_s),
            "recovered_s": _round(self.recovered_s),
            "lost_steps": self.lost_steps,
            "step_at_fault": self.step_at_fault,
            "step_resumed": self.step_resumed,
            "restored_step": self.restored_step,
            "restored_tier": self.restored_tier,
            "restore_rejected": self.restore_rejected,
            "restore_skipped": self.restore_skipped,
            "exception": self.exception,
            "traceback": self.traceback,
            "traceback_source": self.traceback_source,
            "rule": self.rule,
            "injected": self.injected,
            "allowance_s": self.allowance_s,
            "past_allowance_s": self.past_allowance_s,
            "section": self.section,
            "stacks": self.stacks,
            "states": self.states,
            "idle_s": self.idle_s,
            "clean_rank": self.clean_rank,
            "stacks_missing_from": self.stacks_missing_from,
            "phases": {name: t for name, t in self.phases()},
        }


@dataclass
class Generation:
    number: int
    launched_t: float
    hosts: list[str]
    world_size: int
    first_step_t: float | None = None
    last_step: int | None = None
    ended_t: float | None = None
    outcome: str | None = None
    # A planned job: the layout this generation ran and why, what the planner predicted.
    plan: str | None = None
    plan_why: str | None = None
    predicted_step_s: float | None = None
    # Steady-state step time as the journal saw it: from the first step to the last progress.
    first_step: int | None = None
    last_progress: tuple[int, float] | None = None  # (step, t)

    @property
    def measured_step_s(self) -> float | None:
        if self.first_step is None or self.first_step_t is None or self.last_progress is None:
            return None
        steps = self.last_progress[0] - self.first_step
        return (self.last_progress[1] - self.first_step_t) / steps if steps > 0 else None

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k != "last_progress"}
        out["measured_step_s"] = _round(self.measured_step_s)
        return out


@dataclass
class JobView:
    job_id: str
    job_dir: Path
    name: str = ""
    state: str = "running"
    reason: str | None = None
    started_t: float | None = None
    ended_t: float | None = None
    exit_code: int | None = None
    controller_pid: int | None = None
    controller_host: str | None = None  # the machine it runs on (a standby's, after a takeover)
    generation: int = 0
    restarts: int = 0
    step: int | None = None
    root_cause: dict[str, Any] | None = None
    generations: list[Generation] = field(default_factory=list)
    incidents: list[Incident] = field(default_factory=list)
    # What the views of the journal's steady beat need (goodput, the step rate, the timeline),
    # folded in bounded memory: no list of the journal's events is kept.
    goodput: GoodputFold = field(default_factory=GoodputFold)
    series: Series = field(default_factory=Series)
    events_read: int = 0
    hosts: dict[str, str] = field(default_factory=dict)  # host → active, spare, lost, ...
    runs: int = 1  # controllers that ran the job: more than 1 after a Slurm requeue
    slurm_job_id: str | None = None
    # `3 bad lines in events.jsonl (...)`: lines the reader skipped (journal.read_journal), so
    # what is shown may be missing events; None for a sound journal.
    damaged: str | None = None
    # Refused connections and messages, accept pauses, dropped log lines (fold_turned_away).
    turned_away: dict[str, int] = field(default_factory=dict)
    ranks: list[RankView] = field(default_factory=list)  # the current generation's (ranks.py)
    pace: PaceFold = field(default_factory=PaceFold)  # stragglers, each host's pace (pace_fold)

    def age_s(self, now: float | None = None) -> float:
        return (now or time.time()) - (self.started_t or time.time())

    def to_json(self, *, detail: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "job_id": self.job_id,
            "name": self.name,
            "state": self.state,
            "reason": self.reason,
            "generation": self.generation,
            "restarts": self.restarts,
            "step": self.step,
            "started_t": self.started_t,
            "ended_t": self.ended_t,
            "exit_code": self.exit_code,
            "job_dir": str(self.job_dir),
            "hosts": self.hosts,
            "runs": self.runs,
            "controller": {
                "host": self.controller_host,
                "pid": self.controller_pid,
                "term": self.runs,
            },
            "slurm_job_id": self.slurm_job_id,
            "damaged": self.damaged,
            "turned_away": self.turned_away,
        }
        if detail:
            out["root_cause"] = self.root_cause
            out["incidents"] = [i.to_json() for i in self.incidents]
            out["generations"] = [g.to_json() for g in self.generations]
            out["ranks"] = [r.to_json() for r in self.ranks]
            out["pace"] = {"unit": self.pace.unit, "compute_s": self.pace.latest}
            out["stragglers"] = self.pace.stragglers
            out["link_check"] = self.pace.link_check  # --link-check's verdict, if it ran
        return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)
