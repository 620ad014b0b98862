"""What a job is and was, folded from its event log: the one model `status` and `inspect` render.

`fold` is pure except for `controller_alive`, which asks the OS whether the recorded controller
still runs (pid plus start time, so a recycled pid is not mistaken for it). `load_job` also reads,
for each restart, what the relaunched ranks restored: `ftrun.checkpoint` prints one line,
`ftrun-checkpoint: restored step N from memory|storage` (or `no checkpoint found`), into the rank
log that the agent already relays into the job directory, so no new message kind is needed.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ftrun.journal import read_events

STATES = ("running", "succeeded", "failed", "stopped")
# Printed by ftrun.checkpoint on restore (ftrun/checkpoint/restore.py, `_done`); not imported
# from there because that module imports torch. tests/unit/test_jobview.py checks both agree.
RESTORE_LINE = re.compile(
    r"^ftrun-checkpoint: (?:restored step (\d+) from (memory|storage)"
    r"|no checkpoint found, starting from step (0))$"
)
RESTORE_SCAN_BYTES = 1 << 20  # restore runs at start-up: its line is near the top of the log


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
    relaunched_t: float | None = None
    next_generation: int | None = None
    first_step_t: float | None = None
    step_resumed: int | None = None
    restored_step: int | None = None  # what the relaunched ranks restored (from their logs)
    restored_tier: str | None = None  # "memory", "storage" or "none"

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
            ("torn down", self.torn_down_t),
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
    generation: int = 0
    restarts: int = 0
    step: int | None = None
    root_cause: dict[str, Any] | None = None
    generations: list[Generation] = field(default_factory=list)
    incidents: list[Incident] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    hosts: dict[str, str] = field(default_factory=dict)  # host → active, spare, lost, ...

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
        }
        if detail:
            out["root_cause"] = self.root_cause
            out["incidents"] = [i.to_json() for i in self.incidents]
            out["generations"] = [vars(g) for g in self.generations]
        return out


def controller_alive(pid: int | None, create_time: float | None) -> bool:
    if pid is None:
        return False
    try:
        proc = psutil.Process(pid)
        return create_time is None or abs(proc.create_time() - create_time) < 1.0
    except psutil.Error:
        return False


def load_job(job_dir: Path) -> JobView:
    view = fold(job_dir, read_events(job_dir))
    for inc in view.incidents:
        if inc.next_generation is not None:
            found = read_restore(job_dir / "logs" / f"g{inc.next_generation}")
            if found is not None:
                inc.restored_step, inc.restored_tier = found
    return view


def read_restore(log_dir: Path) -> tuple[int, str] | None:
    """(step, tier) that the ranks of one generation restored, from the first rank log that says
    so (every rank restores the same step from the same tier); None if none says so (yet)."""
    try:
        logs = sorted(log_dir.glob("rank*.log"), key=lambda p: (len(p.name), p.name))
    except OSError:
        return None
    for path in logs:
        try:
            with open(path, "rb") as f:
                head = f.read(RESTORE_SCAN_BYTES)
        except OSError:
            continue
        for line in head.decode("utf-8", "replace").splitlines():
            m = RESTORE_LINE.match(line.strip())
            if m:
                return (int(m.group(1)), m.group(2)) if m.group(1) else (0, "none")
    return None


def fold(job_dir: Path, events: list[dict[str, Any]]) -> JobView:
    view = JobView(job_id=job_dir.name, job_dir=job_dir, events=events)
    gens: dict[int, Generation] = {}
    incidents: dict[int, Incident] = {}
    pending_recovery: Incident | None = None
    g: Generation | None
    inc: Incident | None
    create_time = None
    for ev in events:
        kind, t = ev["kind"], ev.get("t", 0.0)
        if kind == "job_started":
            view.name = ev.get("name", "")
            view.started_t = t
            view.controller_pid = ev.get("controller_pid")
            create_time = ev.get("controller_create_time")
        elif kind == "generation_launched":
            g = Generation(ev["gen"], t, ev.get("hosts", []), ev.get("world_size", 0))
            gens[g.number] = g
            view.generation = g.number
            if pending_recovery is not None:
                pending_recovery.relaunched_t = t
                pending_recovery.next_generation = g.number
        elif kind in ("first_step", "progress"):
            g = gens.get(ev.get("gen", -1))
            step = ev.get("step")
            if g is not None and step is not None:
                if kind == "first_step" and g.first_step_t is None:
                    g.first_step_t = t
                g.last_step = step if g.last_step is None else max(g.last_step, step)
                view.step = g.last_step
            if (
                kind == "first_step"
                and pending_recovery is not None
                and pending_recovery.next_generation == ev.get("gen")
            ):
                pending_recovery.first_step_t = t
                pending_recovery.step_resumed = step
                pending_recovery = None
        elif kind == "fault_detected":
            inc = Incident(
                id=ev["incident"],
                generation=ev.get("gen", 0),
                kind=ev.get("fault", "crash"),
                host=ev.get("host"),
                rank=ev.get("rank"),
                fault_t=ev.get("fault_t"),
                detected_t=ev.get("detected_t") or t,
                exit_code=ev.get("exit_code"),
                signal=ev.get("signal"),
                step_at_fault=ev.get("step"),
                exception=ev.get("exception"),
                traceback=ev.get("traceback"),
                traceback_source=ev.get("traceback_source"),
                tail=ev.get("tail") or [],
                injected=ev.get("injected"),
                allowance_s=ev.get("allowance_s"),
                past_allowance_s=ev.get("past_allowance_s"),
                section=ev.get("section"),
                stacks=ev.get("stacks"),
                states=ev.get("states"),
                idle_s=ev.get("idle_s"),
                clean_rank=ev.get("clean_rank"),
                stacks_missing_from=ev.get("stacks_missing_from") or [],
            )
            incidents[inc.id] = inc
            g = gens.get(inc.generation)
            if g is not None and inc.step_at_fault is not None:
                g.last_step = max(g.last_step or 0, inc.step_at_fault)
        elif kind == "fault_classified":
            inc = incidents.get(ev.get("incident", -1))
            if inc is not None:
                inc.tier, inc.decision, inc.reason = (
                    ev.get("tier"),
                    ev.get("decision"),
                    ev.get("reason"),
                )
                inc.rule = ev.get("rule")
        elif kind == "torn_down":
            inc = incidents.get(ev.get("incident", -1))
            if inc is not None:
                inc.torn_down_t = t
        elif kind == "restart":
            view.restarts += 1
            pending_recovery = incidents.get(ev.get("incident", -1))
        elif kind == "generation_ended":
            g = gens.get(ev.get("gen", -1))
            if g is not None:
                g.ended_t, g.outcome = t, ev.get("outcome")
                if ev.get("step") is not None:
                    g.last_step = max(g.last_step or 0, ev["step"])
                    view.step = g.last_step
        elif kind == "job_finished":
            view.state = ev.get("state", "failed")
            view.reason = ev.get("reason")
            view.exit_code = ev.get("exit_code")
            view.root_cause = ev.get("root_cause")
            view.ended_t = t
    view.generations = [gens[k] for k in sorted(gens)]
    view.incidents = [incidents[k] for k in sorted(incidents)]
    if view.ended_t is None and not controller_alive(view.controller_pid, create_time):
        view.state = "failed"
        view.reason = "the controller died without finishing the job (killed, or its host was lost)"
    view.hosts = fold_hosts(events)
    return view


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def fold_hosts(events: list[dict[str, Any]]) -> dict[str, str]:
    """Each host's state as the journal tells it: active (in the current generation), spare
    (connected, waiting), starting, unreachable, lost, removed."""
    hosts: dict[str, str] = {}
    for ev in events:
        kind, host = ev.get("kind"), ev.get("host")
        if kind == "job_started":
            for h in [*ev.get("hosts", []), *ev.get("spares", [])]:
                hosts[h] = "starting"
        elif kind == "agent_connected" and host is not None:
            hosts[host] = "spare" if hosts.get(host) != "active" else "active"
        elif kind == "host_unreachable" and host is not None and hosts.get(host) != "removed":
            hosts[host] = "unreachable"
        elif kind == "fault_detected" and ev.get("fault") == "host-lost" and host is not None:
            hosts[host] = "lost"
        elif kind == "host_removed" and host is not None:
            hosts[host] = "removed"
        elif kind == "host_added" and host is not None:
            hosts[host] = "starting"
        elif kind == "generation_launched":
            for h, state in hosts.items():
                if state == "active":
                    hosts[h] = "spare"
            for h in ev.get("hosts", []):
                hosts[h] = "active"
    return hosts
