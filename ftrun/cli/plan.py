"""`ftrun plan`: the DP × PP layouts a profile allows on given slots, ranked fastest first.

Reads the profile file and renders; every decision is ftrun.planner's (docs/planner.md), the
same code the controller runs for a planned job.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from ftrun.cli.launch_inputs import device_memory_bytes
from ftrun.cli.render import make_console
from ftrun.errors import UsageError
from ftrun.planner import (
    SCHEDULES,
    Layout,
    Profile,
    best_layout,
    format_bytes,
    place_ranks,
    rank_layouts,
)

console = make_console()


def plan(
    profile: Path = typer.Option(
        ..., "--profile", help="The model's profile.json (`ftrun profile` writes one)."
    ),
    slots: str = typer.Option(
        ..., "--slots", help="Slots (devices) per host, comma-separated, e.g. 8,8,8,7."
    ),
    global_batch: int | None = typer.Option(
        None, "--global-batch", help="Samples per step, kept exactly [default: the profile's]."
    ),
    device_memory: str | None = typer.Option(
        None,
        "--device-memory",
        help="Memory per device: 16GiB, 512MiB or bytes [default: the profile's, else unbounded].",
    ),
    granularity: int = typer.Option(
        1, "--granularity", help="Use only DP x PP that are a multiple of this (one host's nproc)."
    ),
    schedule: list[str] | None = typer.Option(
        None,
        "--schedule",
        help=f"Schedules to consider (repeatable) [default: {', '.join(SCHEDULES)}].",
    ),
    top: int = typer.Option(10, "--top", help="Show this many layouts."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Rank the DP x PP layouts of a profiled model on the given slots, fastest first."""
    problems: list[str] = []
    per_host = _slots(slots, problems)
    budget = device_memory_bytes(device_memory, problems)
    if top < 1:
        problems.append(f"--top {top} must be at least 1")
    if problems:
        raise UsageError("; ".join(problems), hint="see `ftrun plan --help`")
    model = _load(profile)
    batch = global_batch if global_batch is not None else model.global_batch
    if batch is None:
        raise UsageError(
            f"{profile} gives no global_batch", hint="pass --global-batch (samples per step)"
        )
    if budget is None:
        budget = model.device_memory_bytes
    schedules = tuple(schedule) if schedule else SCHEDULES
    options: dict[str, Any] = dict(
        slots=per_host,
        global_batch=batch,
        device_memory_bytes=budget,
        granularity=granularity,
        schedules=schedules,
    )
    ranked = rank_layouts(model, **options)
    if not ranked:
        best_layout(model, **options)  # raises NoLayoutFits, saying why
    if as_json:
        best = ranked[0].step_s
        print(
            json.dumps(
                [
                    {**x.to_plan(), "figures": {**x.figures(), "relative": best / x.step_s}}
                    for x in ranked[:top]
                ],
                indent=2,
            )
        )
        return
    console.print(_table(ranked[:top], budget))
    shown = ranked[0]
    hosts = place_ranks(per_host, shown.slots_used)
    console.print(
        f"best: {shown.name} {shown.schedule}, {shown.step_s:.3f} s/step predicted "
        f"({shown.global_batch / shown.step_s:.0f} samples/s); ranks per host: "
        + ", ".join(f"host {i}: {_span(ranks)}" for i, ranks in enumerate(hosts)),
        soft_wrap=True,
    )
    if len(ranked) > top:
        console.print(Text(f"{len(ranked) - top} more: --top {len(ranked)}", "dim"))


def _table(ranked: list[Layout], budget: int | None) -> Table:
    best = ranked[0].step_s
    table = Table(title=f"layouts, fastest first (memory budget {_budget(budget)})")
    for column in ("#", "layout", "stages (layers)", "m × M", "memory", "step", "rel.", "slots"):
        table.add_column(column, justify="right" if column in ("#", "step", "rel.") else "left")
    for i, x in enumerate(ranked, 1):
        table.add_row(
            str(i),
            f"{x.name} {x.schedule}",
            x.stage_text,
            f"{x.micro_batch} × {x.micro_batches}",
            format_bytes(x.max_memory_bytes),
            f"{x.step_s:.3f} s",
            f"{best / x.step_s:.2f}",
            f"{x.slots_used} (+{x.spares} spare)",
        )
    return table


def _budget(budget: int | None) -> str:
    return "unbounded" if budget is None else format_bytes(budget)


def _span(ranks: tuple[int, ...]) -> str:
    if not ranks:
        return "none"
    return str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}"


def _slots(text: str, problems: list[str]) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        counts = []
    if not counts or any(n < 0 for n in counts) or sum(counts) < 1:
        problems.append(f"--slots {text!r} is not a comma-separated list of slots per host (8,8,7)")
        return []
    return counts


def _load(path: Path) -> Profile:
    try:
        document = json.loads(path.read_text())
    except OSError as e:
        raise UsageError(
            f"cannot read the profile {path}: {e.strerror or e}",
            hint="`ftrun profile` writes one; tests/data/profile_gpt_small.json is a sample",
        ) from None
    except ValueError as e:
        raise UsageError(
            f"the profile {path} is not JSON: {e}", hint="`ftrun profile` writes a valid one"
        ) from None
    return Profile.from_dict(document, source=str(path))


def register(app: typer.Typer) -> None:
    app.command()(plan)
