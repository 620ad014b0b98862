"""Replaying a job's events into a JobView: the journal is the only source (STYLE.md).

`fold` is pure except for `controller_alive`, which asks the OS whether the recorded controller
still runs (pid plus start time, so a recycled pid is not mistaken for it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil

from ftrun.jobview.ranks import fold_ranks
from ftrun.jobview.views import Generation, Incident, JobView


def controller_alive(pid: int | None, create_time: float | None) -> bool:
    if pid is None or pid <= 0:  # psutil raises ValueError for these: a journal's bad pid
        return False
    try:
        proc = psutil.Process(pid)
        return create_time is None or abs(proc.create_time() - create_time) < 1.0
    except (psutil.Error, OverflowError):
        return False


def fold(job_dir: Path, events: list[dict[str, Any]]) -> JobView:
    view = JobView(job_id=job_dir.name, job_dir=job_dir, events=events)
    gens: dict[int, Generation] = {}
    incidents: dict[int, Incident] = {}
    pending_recovery: Incident | None = None
    plans: dict[int, dict[str, Any]] = {}  # gen → its plan_chosen event
    g: Generation | None
    inc: Incident | None
    create_time = None
    for ev in events:
        kind, t = ev["kind"], ev.get("t", 0.0)
        if kind == "job_started":
            view.name = ev.get("name") or ""
            if view.started_t is None:
                view.started_t = t
            # A requeued job's next run: running again, whatever the previous run ended as.
            view.ended_t = view.reason = view.exit_code = view.root_cause = None
            view.state = "running"
            view.runs = ev.get("run", 1)
            view.slurm_job_id = ev.get("slurm_job_id", view.slurm_job_id)
            view.controller_pid = ev.get("controller_pid")
            create_time = ev.get("controller_create_time")
        elif kind == "plan_chosen":
            plans[ev.get("gen", -1)] = ev
        elif kind == "generation_launched":
            g = Generation(ev["gen"], t, ev.get("hosts", []), ev.get("world_size", 0))
            if (plan := plans.get(g.number)) is not None:
                g.plan, g.plan_why = plan.get("summary"), plan.get("why")
                g.predicted_step_s = plan.get("predicted_step_s")
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
                    g.first_step_t, g.first_step = t, step
                elif kind == "progress" and g.first_step_t is not None:
                    g.last_progress = (step, t)
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
        elif kind == "restore_rejected":
            inc = incidents.get(ev.get("incident", -1))
            if inc is not None:
                inc.restore_rejected = ev.get("step")
        elif kind == "checkpoint_restored" and ev.get("skipped"):
            inc = next((i for i in incidents.values() if i.next_generation == ev.get("gen")), None)
            if inc is not None:
                inc.restore_skipped = list(ev["skipped"])
        elif kind == "torn_down":
            inc = incidents.get(ev.get("incident", -1))
            if inc is not None:
                inc.torn_down_t = t
        elif kind == "restart":
            view.restarts += 1
            pending_recovery = incidents.get(ev.get("incident", -1))
        elif kind == "resumed":  # a requeued job's next run picks up the incident that ended it
            pending_recovery = incidents.get(ev.get("incident", -1))
        elif kind == "adopted":  # a resumed controller took over the running generation
            pending_recovery = incidents.get(ev.get("incident", -1))
            if pending_recovery is not None:
                pending_recovery.relaunched_t = t
                pending_recovery.next_generation = ev.get("gen")
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
        view.reason = (
            "the controller died without finishing the job (killed, or its host was lost); "
            f"`ftrun resume {view.job_id}` goes on from its freshest checkpoint"
        )
    view.hosts = fold_hosts(events)
    view.turned_away = fold_turned_away(events)
    view.ranks = fold_ranks(events, job_running=view.state == "running")
    return view


# What the controller turned away or went without (docs/security.md), by the events that count it.
TURNED_AWAY = {
    "connection_refused": ("connections refused", "refused_so_far"),
    "message_refused": ("messages refused", "refused_so_far"),
    "accept_paused": ("accept pauses (out of descriptors)", "times"),
}


def fold_turned_away(events: list[dict[str, Any]]) -> dict[str, int]:
    """Counts of refused connections and messages, accept pauses and log lines dropped: the
    events along the way are rate-limited and carry the count so far, and the controller
    journals its totals at its end (`refusals`), so the largest count is the total."""
    out: dict[str, int] = {}
    for ev in events:
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
    return out


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
