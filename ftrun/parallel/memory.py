"""The per-device memory budget: parsing it, and checking a rank's stage against it at setup.

The planner drops layouts whose stages do not fit (DESIGN.md section 7); the runtime checks again
with the stage it actually holds, so that a run on CPU, where nothing would fail for lack of
memory, behaves like a device with the budget: a layout that needs pipelining is refused as
DP-only. The estimate is the planner's: parameters + gradients + Adam state (4 x the parameter
bytes) plus the activations of the micro-batches in flight.
"""

from __future__ import annotations

from ftrun.inflight import in_flight as shared_in_flight
from ftrun.parallel.plan import Plan, PlanError
from ftrun.units import parse_size


class BudgetError(PlanError):
    """This rank's stage does not fit the memory budget."""


def parse_bytes(text: str | int) -> int:
    """'64MiB', '1.5GB', '4096' -> bytes (ftrun/units.py: one reading of sizes everywhere)."""
    if isinstance(text, int):
        return text
    try:
        return parse_size(text)
    except ValueError as e:
        raise PlanError(str(e), hint="e.g. 64MiB, 2GiB, 500MB, 1048576") from None


def in_flight(plan: Plan, position: int) -> int:
    """Micro-batches whose activations a stage at this position holds at once, counted as the
    planner counts them (ftrun/inflight.py); for Interleaved1F1B, virtual-stage micro-batches."""
    return shared_in_flight(
        plan.schedule,
        pp=plan.pp,
        position=position,
        micro_batches=plan.micro_batches,
        v=plan.stages_per_rank,
    )


def check_budget(
    plan: Plan,
    position: int,
    *,
    state_bytes: int,
    act_bytes_per_sample: int,
    budget: int,
    rank: int,
) -> int:
    """Raise BudgetError when the rank's stage needs more than `budget`; return what it needs."""
    # A virtual stage holds its share of the rank's activations (Interleaved1F1B: 1/v each).
    per_sample = act_bytes_per_sample / plan.stages_per_rank
    acts = int(per_sample * plan.micro_batch * in_flight(plan, position))
    need = state_bytes + acts
    if need > budget:
        raise BudgetError(
            f"rank {rank} (pipeline position {position} of {plan.pp}, dp {plan.dp}) needs "
            f"~{need / 2**20:.1f} MiB (state {state_bytes / 2**20:.1f} MiB = 4 x parameters, "
            f"activations {acts / 2**20:.1f} MiB) but the memory budget is "
            f"{budget / 2**20:.1f} MiB",
            hint="use more pipeline stages or smaller micro-batches (plan with `ftrun plan`), "
            "or raise --memory-budget",
            data={"rank": rank, "need_bytes": need, "budget_bytes": budget},
        )
    return need
