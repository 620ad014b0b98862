"""What each part of a recovery costs, in seconds: the figures `ftrun simulate` charges.

The simulator decides with the controller's own code (engine.py) and charges time with these
figures, so how good a simulation is depends on them being measured, not guessed:
`costs_from_journal` takes them from a real job's journal (a `ftrun replay` on the testbed, or
a user's own job on their own cluster: `ftrun simulate --costs-from JOB`), the median of each
phase over the incidents that show it. DEFAULT_COSTS are such figures, measured on this project's
machine (2 cores, CPU, the SSH testbed; the command is in docs/goodput.md).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Costs:
    startup_s: float  # the job started → its first step (agents, rendezvous, imports)
    detect_s: float  # a host lost → detected (heartbeats, --host-lost-timeout)
    teardown_s: float  # detected → the generation torn down
    agent_start_s: float  # a host added → its agent ready
    relaunch_s: float  # launched → first step, restore excluded
    restore_s: float  # the restore a relaunch does (storage: the layout changed)
    reconfigure_s: float  # a planned grow: its persist (persist_first.py), SIGTERM, grace, exit
    stop_s: float  # a stop (Ctrl-C at the end of a replay): SIGTERM, grace, exit
    persist_lag_s: float  # the newest committed checkpoint is this old when a generation ends
    stall_share: float  # the share of training time snapshots stall the training loop
    step_s: float  # a step on the job's original hosts (DP only; a planned job: the planner's)

    def to_json(self) -> dict[str, float]:
        return {f.name: round(getattr(self, f.name), 3) for f in fields(self)}


# Measured on this machine (2 cores, CPU): `ftrun replay ../shared/traces/small-4.csv
# --time-scale 0.2` on the SSH testbed (5 hosts, recipes/gpt_ddp.py, 1 rank a host, gloo; the
# command is in docs/goodput.md), then `costs_from_journal` of its job: run A of
# `scripts/bench_goodput.py` of 2026-11-26, which prints them. (The run of 2026-11-23 had a
# checkpoint stall of 9.8 % and a persist lag of 0.29 s: save() was 2.4x slower then, and a shrink
# restored from storage.) A different run of the same replay is what `ftrun simulate` is checked
# against (tests/integration/test_replay.py).
DEFAULT_COSTS = Costs(
    startup_s=6.08,
    detect_s=1.04,
    teardown_s=0.04,
    agent_start_s=0.98,
    relaunch_s=1.63,
    restore_s=0.52,
    reconfigure_s=3.21,
    stop_s=6.04,
    persist_lag_s=0.0,
    stall_share=0.025,
    step_s=0.93,
)


def costs_from_journal(events: Iterable[dict[str, Any]], base: Costs = DEFAULT_COSTS) -> Costs:
    """The figures a job's journal shows, each the median over the times it happened; a figure
    the journal never shows (no host was lost, say) stays `base`'s."""
    seen: dict[str, list[float]] = {f.name: [] for f in fields(Costs)}
    launched: dict[int, float] = {}
    restore: dict[int, float] = {}
    detected: dict[int, float] = {}  # incident → detected_t
    stalls: dict[int, float] = {}  # gen → rank 0's checkpoint stall so far
    ended_step: dict[int, int | None] = {}
    restored_step: dict[int, int] = {}
    started: float | None = None
    added: dict[str, float] = {}
    reconfigured: float | None = None
    stopping: float | None = None
    first_steps: dict[int, tuple[float, int]] = {}
    last_progress: dict[int, tuple[float, int]] = {}
    worlds: dict[int, int] = {}
    full_world = 0
    for ev in events:
        kind, t, gen = ev.get("kind"), float(ev.get("t", 0.0)), ev.get("gen")
        if kind == "job_started":
            started = t if started is None else started
            full_world = full_world or len(ev.get("hosts") or []) * (ev.get("nproc_per_node") or 1)
        elif kind == "fault_detected" and ev.get("fault") == "host-lost":
            det = float(ev.get("detected_t") or t)
            if isinstance(ev.get("fault_t"), (int, float)):
                seen["detect_s"].append(max(0.0, det - float(ev["fault_t"])))
            detected[ev.get("incident", -1)] = det
        elif kind == "torn_down" and ev.get("incident") in detected:
            seen["teardown_s"].append(max(0.0, t - detected[ev["incident"]]))
        elif kind == "host_added" and isinstance(ev.get("host"), str):
            added[ev["host"]] = t
        elif kind == "agent_connected" and ev.get("host") in added:
            seen["agent_start_s"].append(t - added.pop(ev["host"]))
        elif kind in ("persist_requested", "reconfigure"):  # a grow persists first
            reconfigured = t if reconfigured is None else reconfigured
        elif kind == "stop_requested" and stopping is None:
            stopping = t
        elif kind == "generation_ended":
            if isinstance(gen, int):
                ended_step[gen] = ev.get("step")
            if reconfigured is not None:
                seen["reconfigure_s"].append(t - reconfigured)
            reconfigured = None
        elif kind == "job_finished" and stopping is not None:
            seen["stop_s"].append(t - stopping)  # the ranks and then the agents stopped
            stopping = None
        elif kind == "generation_launched" and isinstance(gen, int):
            launched[gen] = t
            worlds[gen] = ev.get("world_size") or 0
        elif kind == "checkpoint_restored" and isinstance(gen, int):
            restore[gen] = float(ev.get("restore_s") or 0.0)
            if isinstance(ev.get("step"), int):
                restored_step[gen] = ev["step"]
            if gen > 1:
                seen["restore_s"].append(restore[gen])
        elif kind == "first_step" and isinstance(gen, int) and gen in launched:
            if gen > 1:  # the first launch also starts the agents: not a relaunch
                seen["relaunch_s"].append(t - launched[gen] - restore.get(gen, 0.0))
            elif started is not None:
                seen["startup_s"].append(t - started - restore.get(gen, 0.0))
            first_steps[gen] = (t, ev.get("step") or 0)
        elif kind == "progress" and isinstance(gen, int):
            last_progress[gen] = (t, ev.get("step") or 0)
            if isinstance(ev.get("stall_s"), (int, float)):
                stalls[gen] = float(ev["stall_s"])
    for gen, (t0, s0) in first_steps.items():
        if gen in last_progress and last_progress[gen][1] > s0 and worlds.get(gen):
            t1, s1 = last_progress[gen]
            # DP only: a step on the full world takes world/full of this one's time.
            seen["step_s"].append((t1 - t0) / (s1 - s0) * worlds[gen] / (full_world or worlds[gen]))
    step_s = {
        g: (last_progress[g][0] - t0) / (last_progress[g][1] - s0)
        for g, (t0, s0) in first_steps.items()
        if g in last_progress and last_progress[g][1] > s0
    }
    for gen, step in ended_step.items():
        # What a generation's end lost: the steps past the one the next restored, in time.
        if isinstance(step, int) and gen + 1 in restored_step and gen in step_s:
            seen["persist_lag_s"].append(max(0, step - restored_step[gen + 1]) * step_s[gen])
    trained = {
        g: last_progress[g][0] - t0 for g, (t0, _) in first_steps.items() if g in last_progress
    }
    if stalls and sum(trained.values()) > 0:
        seen["stall_share"].append(sum(stalls.values()) / sum(trained.values()))
    measured = {name: statistics.median(v) for name, v in seen.items() if v}
    return replace(base, **measured)
