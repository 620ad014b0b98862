"""`ftrun simulate TRACE`: a job through an availability trace, in simulated time, with the
controller's own decisions; goodput for ftrun, checkpoint-restart and the ideal, side by side.

Every decision is ftrun.sim's (which runs the controller's roster, policy and planner); every
figure of time is measured (ftrun/sim/costs.py): this module reads the options and renders.
"""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
from pathlib import Path

import typer
from rich.table import Table
from rich.text import Text

from ftrun import envcontract
from ftrun.cli.goodput_render import goodput_table
from ftrun.cli.launch_inputs import device_memory_bytes
from ftrun.cli.plan import _load as load_profile
from ftrun.cli.render import make_console
from ftrun.config import resolve_run_dir
from ftrun.errors import UsageError
from ftrun.journal.read import find_job_dir, read_journal
from ftrun.sim.baseline import Baseline, young_daly_interval_s
from ftrun.sim.costs import DEFAULT_COSTS, Costs, costs_from_journal
from ftrun.sim.run import CHECKPOINT_RESTART, FTRUN, IDEAL, Outcome, Setup, simulate
from ftrun.sim.trace import Trace, read_trace

console = make_console()


def simulate_cmd(
    trace: Path = typer.Argument(..., help="An availability trace: t_ms,add|remove,node lines."),
    profile: Path | None = typer.Option(
        None, "--profile", help="The model's profile.json: plan DP x PP [default: DP only]."
    ),
    global_batch: int | None = typer.Option(
        None, "--global-batch", help="Samples per step, kept by every plan [the profile's]."
    ),
    device_memory: str | None = typer.Option(
        None, "--device-memory", help="Memory per device, e.g. 16GiB [the profile's]."
    ),
    nodes_per_host: int = typer.Option(
        1, "--nodes-per-host", help="Ranks (devices) on each host of the trace."
    ),
    min_nodes: int = typer.Option(1, "--min-nodes", help="Fewest hosts the job runs on."),
    max_nodes: int | None = typer.Option(
        None, "--max-nodes", help="Most hosts the job uses [the most the trace has up at once]."
    ),
    time_scale: float = typer.Option(
        1.0, "--time-scale", help="Multiply the trace's times by this (as `ftrun replay` does)."
    ),
    tail: float = typer.Option(
        60.0, "--tail", help="Seconds the job runs after the trace's last event."
    ),
    costs_from: str | None = typer.Option(
        None,
        "--costs-from",
        help="A job (id or prefix) whose journal gives the figures of time [this machine's].",
    ),
    run_dir: Path | None = typer.Option(
        None, "--run-dir", envvar=envcontract.RUN_DIR, help="Where --costs-from's job is."
    ),
    baseline_detect: float = typer.Option(
        15.0, "--baseline-detect", help="Seconds torchelastic takes to notice a lost node."
    ),
    baseline_restart: float = typer.Option(
        10.0, "--baseline-restart", help="Seconds a torchrun restart takes (rendezvous, start)."
    ),
    baseline_checkpoint_stall: float = typer.Option(
        4.5, "--baseline-checkpoint-stall", help="Seconds each checkpoint-restart save stalls."
    ),
    baseline_checkpoint_every: float | None = typer.Option(
        None,
        "--baseline-checkpoint-every",
        help="Seconds between its saves [the Young/Daly optimum for the trace].",
    ),
    keep: Path | None = typer.Option(
        None, "--keep", help="Keep the simulated jobs' journals here (for `ftrun inspect`)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Simulate a job on a trace through the controller's own decisions: goodput of ftrun,
    checkpoint-restart (torchrun elastic) and the ideal."""
    problems = []
    if nodes_per_host < 1:
        problems.append(f"--nodes-per-host must be at least 1 (got {nodes_per_host})")
    if min_nodes < 1 or (max_nodes is not None and max_nodes < min_nodes):
        problems.append("--min-nodes must be at least 1 and --max-nodes at least --min-nodes")
    if not 0 < time_scale <= 1e6 or not 0 <= tail <= 1e9:
        problems.append("--time-scale must be more than 0, --tail 0 or more")
    for name, value in (
        ("--baseline-detect", baseline_detect),
        ("--baseline-restart", baseline_restart),
        ("--baseline-checkpoint-stall", baseline_checkpoint_stall),
    ):
        if not 0 <= value <= 1e9:
            problems.append(f"{name} must be 0 or more seconds (got {value:g})")
    if baseline_checkpoint_every is not None and not baseline_checkpoint_every > 0:
        problems.append("--baseline-checkpoint-every must be more than 0 seconds")
    budget = device_memory_bytes(device_memory, problems)
    if problems:
        raise UsageError("; ".join(problems), hint="see `ftrun simulate --help`")
    model = load_profile(profile) if profile is not None else None
    if model is not None and (global_batch or model.global_batch) is None:
        raise UsageError(f"{profile} gives no global_batch", hint="pass --global-batch")
    the_trace = read_trace(trace).scaled(time_scale)
    if too_long := the_trace.span_problem(tail * time_scale):
        raise UsageError(too_long, hint="give a shorter trace or a smaller --time-scale")
    costs = _costs(costs_from, run_dir)
    every = baseline_checkpoint_every or young_daly_interval_s(
        baseline_checkpoint_stall, the_trace.mean_time_between_changes_s()
    )
    setup = Setup(
        nproc_per_node=nodes_per_host,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        profile_path=str(profile) if profile else None,
        profile=model,
        global_batch=global_batch,
        device_memory_bytes=budget,
        tail_s=tail * time_scale,  # trace time, like the trace
        costs=costs,
        baseline=Baseline(
            detect_s=baseline_detect,
            restart_s=baseline_restart,
            checkpoint_every_s=every,
            checkpoint_stall_s=baseline_checkpoint_stall,
        ),
    )
    work = Path(tempfile.mkdtemp(prefix="ftrun-simulate-")) if keep is None else keep
    # SIGTERM (a timeout, a scheduler) unwinds like Ctrl-C: the temporary journals go with us.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        outcomes = simulate(the_trace, setup, work_dir=work)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
    if as_json:
        print(json.dumps(_json(the_trace, setup, outcomes), indent=2))
        return
    _render(the_trace, setup, outcomes, keep)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _costs(job: str | None, run_dir: Path | None) -> Costs:
    if job is None:
        return DEFAULT_COSTS
    journal = read_journal(find_job_dir(resolve_run_dir(run_dir), job))
    return costs_from_journal(journal.events)


def _json(trace: Trace, setup: Setup, outcomes: dict[str, Outcome]) -> dict[str, object]:
    ideal = outcomes[IDEAL].goodput
    return {
        "trace": trace.path,
        "events": len(trace.events),
        "costs": setup.costs.to_json(),
        "baseline": vars(setup.baseline),
        "strategies": {
            name: {
                "goodput": round(o.goodput, 4),
                "of_ideal": round(o.goodput / ideal, 4) if ideal else None,
                "incidents": o.incidents,
                "generations": o.generations,
                "account": o.report.to_json() | {"generations": None} if o.report else None,
                "journal": str(o.job_dir) if o.job_dir else None,
            }
            for name, o in outcomes.items()
        },
    }


def _render(trace: Trace, setup: Setup, outcomes: dict[str, Outcome], keep: Path | None) -> None:
    ideal = outcomes[IDEAL].goodput
    table = Table(title=f"goodput on {trace.path} ({len(trace.events)} events)")
    for col in ("strategy", "goodput", "of ideal", "incidents", "generations"):
        table.add_column(col, justify="left" if col == "strategy" else "right")
    for name in (FTRUN, CHECKPOINT_RESTART, IDEAL):
        o = outcomes[name]
        table.add_row(
            name,
            f"{o.goodput:.1%}",
            f"{o.goodput / ideal:.2f}" if ideal else "—",
            str(o.incidents) if o.report else "",
            str(o.generations) if o.report else "",
        )
    console.print(table)
    ours, theirs = outcomes[FTRUN].goodput, outcomes[CHECKPOINT_RESTART].goodput
    if theirs > 0:
        console.print(f"ftrun / checkpoint-restart: {ours / theirs:.1f}x")
    b = setup.baseline
    console.print(
        Text(
            f"checkpoint-restart: detection {b.detect_s:g} s, restart {b.restart_s:g} s, a save "
            f"every {b.checkpoint_every_s:.0f} s stalling {b.checkpoint_stall_s:g} s",
            style="dim",
        )
    )
    for name in (FTRUN, CHECKPOINT_RESTART):
        report = outcomes[name].report
        if report is not None:
            console.print()
            console.print(Text(f"{name}: where the time went", style="bold"))
            console.print(goodput_table(report))
    if keep is not None:
        console.print(
            Text(f"journals kept in {keep}: `ftrun inspect --run-dir {keep} sim-`", style="dim")
        )


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate_cmd)
