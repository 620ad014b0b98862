"""One simulation of a trace: ftrun, checkpoint-restart and the ideal, side by side.

ftrun and the baseline each run through the engine into a journal of their own (in `work_dir`),
and their goodput is read from it by ftrun.jobview.goodput, as for a real job; the ideal is
computed (ideal.py). All three cover the same stretch of the trace: from the first moment
`min_nodes` hosts are up to the trace's last event plus a tail.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftrun.config import LaunchConfig
from ftrun.errors import UsageError
from ftrun.jobview.goodput import GoodputReport, account
from ftrun.journal import Journal
from ftrun.journal.read import read_journal
from ftrun.planner import Profile
from ftrun.sim.baseline import Baseline
from ftrun.sim.costs import Costs
from ftrun.sim.engine import Simulation
from ftrun.sim.ideal import ideal_goodput, speed_by_hosts
from ftrun.sim.trace import Trace

FTRUN, CHECKPOINT_RESTART, IDEAL = "ftrun", "checkpoint-restart", "ideal"


@dataclass(frozen=True, kw_only=True)
class Setup:
    nproc_per_node: int = 1
    min_nodes: int = 1
    max_nodes: int | None = None  # None: the most hosts the trace has up at once
    profile_path: str | None = None
    profile: Profile | None = None
    global_batch: int | None = None
    device_memory_bytes: int | None = None
    replan_horizon_s: float = 1800.0
    tail_s: float = 60.0  # after the trace's last event
    costs: Costs
    baseline: Baseline


@dataclass
class Outcome:
    name: str
    goodput: float
    report: GoodputReport | None = None
    job_dir: Path | None = None
    incidents: int = 0
    generations: int = 0
    figures: dict[str, Any] = field(default_factory=dict)


def simulate(trace: Trace, setup: Setup, *, work_dir: Path) -> dict[str, Outcome]:
    start_s = trace.first_time_with(setup.min_nodes)
    if start_s is None:
        raise UsageError(
            f"{trace.path} never has {setup.min_nodes} host(s) up at once",
            hint="lower --min-nodes",
        )
    want = setup.max_nodes or trace.most_up()
    end_s = trace.duration_s + setup.tail_s
    out = {
        FTRUN: _run(trace, setup, work_dir, start_s, end_s, want, baseline=None),
        CHECKPOINT_RESTART: _run(trace, setup, work_dir, start_s, end_s, want, setup.baseline),
    }
    speed = speed_by_hosts(
        want,
        nproc_per_node=setup.nproc_per_node,
        profile=setup.profile,
        global_batch=setup.global_batch,
        device_memory_bytes=setup.device_memory_bytes,
    )
    out[IDEAL] = Outcome(IDEAL, ideal_goodput(trace, start_s=start_s, end_s=end_s, speed=speed))
    return out


def _run(
    trace: Trace,
    setup: Setup,
    work_dir: Path,
    start_s: float,
    end_s: float,
    want: int,
    baseline: Baseline | None,
) -> Outcome:
    name = FTRUN if baseline is None else CHECKPOINT_RESTART
    job_id = f"sim-{name}-{uuid.uuid4().hex[:6]}"
    config = LaunchConfig(
        job_id=job_id,
        job_name=f"simulated {name}: {Path(trace.path).name}",
        run_dir=work_dir,
        script="(simulated)",
        hosts=tuple(trace.up_at(start_s)),
        transport="ssh",
        nproc_per_node=setup.nproc_per_node,
        min_nodes=setup.min_nodes,
        max_nodes=want,
        max_restarts=1_000_000,  # a spot job's hosts come and go; its budget is not the point
        profile=setup.profile_path,
        global_batch=setup.global_batch,
        device_memory_bytes=setup.device_memory_bytes,
        replan_horizon_s=setup.replan_horizon_s,
    )
    sim = Simulation(
        trace,
        config=config,
        costs=setup.costs,
        journal_for=lambda clock: Journal(work_dir / job_id, clock=clock),
        profile=setup.profile,
        baseline=baseline,
        start_s=start_s,
        end_s=end_s,
    )
    sim.run()
    events = read_journal(work_dir / job_id).events
    report = account(events, running=False)
    return Outcome(
        name,
        report.job.ratio or 0.0,
        report,
        work_dir / job_id,
        incidents=sim.incidents.count,
        generations=sim.generation,
    )
