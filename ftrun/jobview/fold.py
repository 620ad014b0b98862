"""Replaying a job's events into a JobView: the journal is the only source (STYLE.md).

`fold` is pure except for `controller_alive`, which asks the OS whether the recorded controller
still runs (pid plus start time, so a recycled pid is not mistaken for it).
"""

from __future__ import annotations

import copy
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ftrun.jobview.goodput_fold import GoodputFold
from ftrun.jobview.pace_fold import PACE_KINDS, PaceFold
from ftrun.jobview.ranks import RanksFold
from ftrun.jobview.series import Series
from ftrun.jobview.views import Generation, Incident, JobView


def controller_alive(pid: int | None, create_time: float | None) -> bool:
    if pid is None or pid <= 0:  # psutil raises ValueError for these: a journal's bad pid
        return False
    try:
        proc = psutil.Process(pid)
        return create_time is None or abs(proc.create_time() - create_time) < 1.0
    except (psutil.Error, OverflowError):
        return False


def fold(job_dir: Path, events: Iterable[dict[str, Any]]) -> JobView:
    folder = JobFolder()
    for ev in events:
        folder.feed(ev)
    return folder.view(job_dir)


@dataclass
class JobFolder:
    """The journal folded one event at a time (`feed`), in memory that grows with generations
    and incidents, not with steps; `view` is the JobView of what it has seen, and the fold goes
    on after it. Its state is plain data (summary.py writes and reads it)."""

    job: dict[str, Any] = field(default_factory=lambda: dict(FRESH_JOB, runs=1, restarts=0))
    gens: dict[int, Generation] = field(default_factory=dict)
    incidents: dict[int, Incident] = field(default_factory=dict)
    pending_recovery: int | None = None  # the incident the next first step closes
    plans: dict[int, dict[str, Any]] = field(default_factory=dict)  # gen → summary, why, ...
    hosts: dict[str, str] = field(default_factory=dict)
    turned_away: dict[str, int] = field(default_factory=dict)
    ranks: RanksFold = field(default_factory=RanksFold)
    goodput: GoodputFold = field(default_factory=GoodputFold)
    series: Series = field(default_factory=Series)
    pace: PaceFold = field(default_factory=PaceFold)
    events: int = 0

    def feed(self, ev: dict[str, Any]) -> None:
        self.events += 1
        kind = ev["kind"]
        if kind in HOST_KINDS:
            _feed_hosts(self.hosts, ev)
        if kind in TURNED_AWAY_KINDS:
            _feed_turned_away(self.turned_away, ev)
        if kind in RANK_KINDS:
            self.ranks.feed(ev)
        if kind in PACE_KINDS:
            self.pace.feed(ev)
        if kind in JOB_KINDS:
            _feed_job(self, ev)
        self.goodput.feed(ev)
        self.series.feed(ev)

    def view(self, job_dir: Path, *, alive: bool | None = None) -> JobView:
        """The job as far as fed. `alive`: whether its controller runs (None: ask the OS)."""
        job = self.job
        view = JobView(job_id=job_dir.name, job_dir=job_dir)
        for key in FRESH_JOB.keys() - {"create_time"}:
            setattr(view, key, copy.deepcopy(job[key]))
        view.runs, view.restarts = job["runs"], job["restarts"]
        view.generations = [copy.deepcopy(self.gens[k]) for k in sorted(self.gens)]
        view.incidents = [copy.deepcopy(self.incidents[k]) for k in sorted(self.incidents)]
        elsewhere = view.controller_host not in (None, socket.gethostname())
        if alive is None and not elsewhere:
            alive = controller_alive(view.controller_pid, job["create_time"])
        if view.ended_t is None and elsewhere and alive is None:
            # Its pid is another machine's (a standby's replica, a shared run directory).
            view.reason = view.reason or (
                f"its controller (term {view.runs}) runs on {view.controller_host}: not "
                "checked from here"
            )
        elif view.ended_t is None and not alive:
            view.state = "failed"
            view.reason = (
                "the controller died without finishing the job (killed, or its host was lost); "
                f"`ftrun resume {view.job_id}` goes on from its freshest checkpoint"
            )
        view.hosts = dict(self.hosts)
        view.turned_away = dict(self.turned_away)
        view.ranks = self.ranks.ranks(job_running=view.state == "running")
        view.goodput, view.series, view.events_read = self.goodput, self.series, self.events
        view.pace = copy.deepcopy(self.pace)
        return view


# The job's own figures, as a job_started resets them (a requeued job's next run).
FRESH_JOB: dict[str, Any] = {
    "name": "", "state": "running", "reason": None, "started_t": None, "ended_t": None,
    "exit_code": None, "controller_pid": None, "controller_host": None, "generation": 0,
    "step": None,
    "root_cause": None, "slurm_job_id": None, "create_time": None,
}  # fmt: skip


def _feed_job(f: JobFolder, ev: dict[str, Any]) -> None:
    kind, t, job = ev["kind"], ev.get("t", 0.0), f.job
    g: Generation | None
    inc: Incident | None
    if kind == "job_started":
        job["name"] = ev.get("name") or ""
        if job["started_t"] is None:
            job["started_t"] = t
        # A requeued job's next run: running again, whatever the previous run ended as.
        job["ended_t"] = job["reason"] = job["exit_code"] = job["root_cause"] = None
        job["state"] = "running"
        job["runs"] = ev.get("run", 1)
        job["slurm_job_id"] = ev.get("slurm_job_id", job["slurm_job_id"])
        job["controller_pid"] = ev.get("controller_pid")
        job["controller_host"] = ev.get("controller_host")
        job["create_time"] = ev.get("controller_create_time")
    elif kind == "plan_chosen":
        f.plans[ev.get("gen", -1)] = {k: ev.get(k) for k in ("summary", "why", "predicted_step_s")}
    elif kind == "generation_launched":
        g = Generation(ev["gen"], t, ev.get("hosts", []), ev.get("world_size", 0))
        if (plan := f.plans.get(g.number)) is not None:
            g.plan, g.plan_why = plan["summary"], plan["why"]
            g.predicted_step_s = plan["predicted_step_s"]
        f.gens[g.number] = g
        job["generation"] = g.number
        if (inc := f.incidents.get(f.pending_recovery or -1)) is not None:
            inc.relaunched_t = t
            inc.next_generation = g.number
    elif kind in ("first_step", "progress"):
        g = f.gens.get(ev.get("gen", -1))
        step = ev.get("step")
        if g is not None and step is not None:
            if kind == "first_step" and g.first_step_t is None:
                g.first_step_t, g.first_step = t, step
            elif kind == "progress" and g.first_step_t is not None:
                g.last_progress = (step, t)
            g.last_step = step if g.last_step is None else max(g.last_step, step)
            job["step"] = g.last_step
        inc = f.incidents.get(f.pending_recovery or -1)
        if kind == "first_step" and inc is not None and inc.next_generation == ev.get("gen"):
            inc.first_step_t = t
            inc.step_resumed = step
            f.pending_recovery = None
    elif kind == "fault_detected":
        inc = Incident(
            id=ev["incident"],
            generation=ev.get("gen", 0),
            kind=ev.get("fault", "crash"),
            host=ev.get("host"),
            rank=ev.get("rank"),
            fault_t=ev.get("fault_t"),
            detected_t=ev.get("detected_t") or t,
            step_at_fault=ev.get("step"),
            tail=ev.get("tail") or [],
            stacks_missing_from=ev.get("stacks_missing_from") or [],
            **{k: ev.get(k) for k in INCIDENT_FIELDS},  # type: ignore[arg-type]
        )
        f.incidents[inc.id] = inc
        g = f.gens.get(inc.generation)
        if g is not None and inc.step_at_fault is not None:
            g.last_step = max(g.last_step or 0, inc.step_at_fault)
    elif kind == "fault_classified":
        inc = f.incidents.get(ev.get("incident", -1))
        if inc is not None:
            inc.tier, inc.decision, inc.reason = (
                ev.get("tier"),
                ev.get("decision"),
                ev.get("reason"),
            )
            inc.rule = ev.get("rule")
    elif kind == "restore_rejected":
        inc = f.incidents.get(ev.get("incident", -1))
        if inc is not None:
            inc.restore_rejected = ev.get("step")
    elif kind == "checkpoint_restored" and ev.get("skipped"):
        gen = ev.get("gen")
        inc = next((i for i in f.incidents.values() if i.next_generation == gen), None)
        if inc is not None:
            inc.restore_skipped = list(ev["skipped"])
    elif kind == "torn_down":
        inc = f.incidents.get(ev.get("incident", -1))
        if inc is not None:
            inc.torn_down_t = ev.get("torn_down_t") or t  # told after the fact (requeue_note.py)
    elif kind in ("restart", "resumed", "adopted"):
        # restart: relaunched after it; resumed: a requeued job's next run picks up the
        # incident that ended it; adopted: a resumed controller took over the generation.
        job["restarts"] += kind == "restart"
        inc = f.incidents.get(ev.get("incident", -1))
        f.pending_recovery = None if inc is None else inc.id
        if kind == "adopted" and inc is not None:
            inc.relaunched_t = t
            inc.next_generation = ev.get("gen")
    elif kind == "generation_ended":
        g = f.gens.get(ev.get("gen", -1))
        if g is not None:
            g.ended_t, g.outcome = t, ev.get("outcome")
            if ev.get("step") is not None:
                g.last_step = max(g.last_step or 0, ev["step"])
                job["step"] = g.last_step
    elif kind == "job_finished":
        job["state"] = ev.get("state", "failed")
        job["reason"] = ev.get("reason")
        job["exit_code"] = ev.get("exit_code")
        job["root_cause"] = ev.get("root_cause")
        job["ended_t"] = t


# The kinds each part of the fold reads (the journal's bulk, heartbeat_stats and the commits,
# goes past most of them).
JOB_KINDS = frozenset(
    "job_started plan_chosen generation_launched first_step progress fault_detected "
    "fault_classified restore_rejected checkpoint_restored torn_down restart resumed adopted "
    "generation_ended job_finished".split()
)
HOST_KINDS = frozenset(
    "job_started agent_connected host_unreachable fault_detected host_removed host_added "
    "generation_launched".split()
)
RANK_KINDS = frozenset("generation_launched rank_started rank_exited generation_ended".split())
INCIDENT_FIELDS = (
    "exit_code signal exception traceback traceback_source injected allowance_s "
    "past_allowance_s section stacks states idle_s clean_rank taken_over_t"
).split()


# What the controller turned away or went without (docs/security.md), by the events that count it.
TURNED_AWAY = {
    "connection_refused": ("connections refused", "refused_so_far"),
    "message_refused": ("messages refused", "refused_so_far"),
    "accept_paused": ("accept pauses (out of descriptors)", "times"),
}
TURNED_AWAY_KINDS = frozenset([*TURNED_AWAY, "refusals", "log_lines_dropped"])


def fold_turned_away(events: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for ev in events:
        _feed_turned_away(out, ev)
    return out


def _feed_turned_away(out: dict[str, int], ev: dict[str, Any]) -> None:
    """Counts of refused connections and messages, accept pauses and log lines dropped: the
    events along the way are rate-limited and carry the count so far, and the controller
    journals its totals at its end (`refusals`), so the largest count is the total."""
    kind = ev["kind"]
    if kind in TURNED_AWAY:
        label, key = TURNED_AWAY[kind]
        count = ev.get(key)
        if isinstance(count, int) and not isinstance(count, bool):
            out[label] = max(out.get(label, 0), count)
    elif kind == "refusals":  # the controller's totals at its end
        for label, key in (
            ("connections refused", "connections"),
            ("messages refused", "messages"),
            ("accept pauses (out of descriptors)", "accept_pauses"),
        ):
            count = ev.get(key)
            if isinstance(count, int) and not isinstance(count, bool) and count:
                out[label] = max(out.get(label, 0), count)
    elif kind == "log_lines_dropped" and isinstance(ev.get("by_reason"), dict):
        dropped = [n for n in ev["by_reason"].values() if isinstance(n, int)]
        out["log lines dropped"] = out.get("log lines dropped", 0) + sum(dropped)


def fold_hosts(events: list[dict[str, Any]]) -> dict[str, str]:
    """Each host's state as the journal tells it: active (in the current generation), spare
    (connected, waiting), starting, unreachable, lost, removed."""
    hosts: dict[str, str] = {}
    for ev in events:
        _feed_hosts(hosts, ev)
    return hosts


def _feed_hosts(hosts: dict[str, str], ev: dict[str, Any]) -> None:
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
