"""Every DP × PP layout the slots allow, costed and ranked fastest first.

For each pipeline depth PP ≤ min(L, slots) and each DP from ⌊slots / PP⌋ down to 1 (slots left
over are spares), with DP·PP a multiple of `granularity` (the controller passes one host's
nproc: torchrun gives every host the same), the global batch is kept exactly: DP·m·M = B with
M ≥ PP micro-batches per replica. Every divisor m of B / DP is tried, the stages split for it
(split.py, memory-aware), and the fastest m that fits stays: one layout per DP × PP and
schedule, and a schedule only where it beats the simpler ones on the same DP × PP (GPipe never
beats 1F1B here: the same time, more memory; Interleaved1F1B, which needs M % PP = 0 and 2·PP
layers, sends twice as often for a bubble half as long).

Ranked by predicted step time; ties go to fewer slots, then a shallower pipeline, then the
schedule order of layout.SCHEDULES. Slots per host may differ: only their sum counts here
(layout.place_ranks maps ranks to hosts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ftrun.errors import UsageError
from ftrun.planner import cost
from ftrun.planner.layout import SCHEDULES, STAGES_PER_RANK, Layout
from ftrun.planner.profile import Profile
from ftrun.planner.split import Stages, balanced_split
from ftrun.planner.units import format_bytes

_HINT_MEMORY = (
    "more slots (a deeper pipeline spreads the layers thinner), a larger --device-memory, "
    "or a smaller global batch"
)


class NoLayoutFits(UsageError):
    """No layout keeps the global batch within the slots and the memory budget; says why."""


@dataclass(frozen=True)
class _Miss:
    """The leanest layout tried that did not fit, for NoLayoutFits's message."""

    memory_bytes: int
    text: str


def rank_layouts(
    profile: Profile,
    *,
    slots: Sequence[int],
    global_batch: int,
    device_memory_bytes: int | None,
    granularity: int = 1,
    schedules: Sequence[str] = SCHEDULES,
) -> list[Layout]:
    """Every layout that fits, fastest first; [] when none does (best_layout says why)."""
    return _rank(profile, slots, global_batch, device_memory_bytes, granularity, schedules)[0]


def best_layout(
    profile: Profile,
    *,
    slots: Sequence[int],
    global_batch: int,
    device_memory_bytes: int | None,
    granularity: int = 1,
    schedules: Sequence[str] = SCHEDULES,
) -> Layout:
    """The fastest layout; raises NoLayoutFits (with the reason and what to change) if none."""
    ranked, miss = _rank(profile, slots, global_batch, device_memory_bytes, granularity, schedules)
    if ranked:
        return ranked[0]
    usable = sum(slots)
    if miss is None:
        raise NoLayoutFits(
            f"no DP × PP layout keeps the global batch of {global_batch} on {usable} slots "
            f"in multiples of {granularity}: DP must divide the batch and each replica needs "
            "at least PP micro-batches",
            hint="choose a global batch with more divisors, or more slots per host",
            data={"global_batch": global_batch, "slots": usable, "granularity": granularity},
        )
    assert device_memory_bytes is not None, "without a budget every layout fits"
    largest = max(profile.layers, key=lambda layer: layer.state_bytes)
    raise NoLayoutFits(
        f"no layout fits {format_bytes(device_memory_bytes)} per device: the leanest tried, "
        f"{miss.text}, needs {format_bytes(miss.memory_bytes)} on its fullest device "
        f"(layer {largest.name!r} alone holds {format_bytes(largest.state_bytes)} of state)",
        hint=_HINT_MEMORY,
        data={"budget_bytes": device_memory_bytes, "leanest_bytes": miss.memory_bytes},
    )


def _rank(
    profile: Profile,
    slots: Sequence[int],
    global_batch: int,
    budget: int | None,
    granularity: int,
    schedules: Sequence[str],
) -> tuple[list[Layout], _Miss | None]:
    _check(slots, global_batch, budget, granularity, schedules)
    usable = sum(slots)
    n_layers = len(profile.layers)
    found: list[Layout] = []
    miss: _Miss | None = None
    splits: dict[tuple[str, int, int, int], Stages | None] = {}
    needs: dict[tuple[str, int, int, int], int] = {}  # what a layout that misses would need
    for pp in range(1, min(n_layers, usable) + 1):
        for dp in range(usable // pp, 0, -1):
            if (dp * pp) % granularity or global_batch % dp:
                continue
            per_replica = global_batch // dp
            for schedule in schedules:
                v = STAGES_PER_RANK[schedule]
                if v > 1 and (pp < 2 or n_layers < v * pp):
                    continue
                best: Layout | None = None
                for m in _divisors(per_replica):
                    M = per_replica // m
                    if M < pp or (v > 1 and M % pp):
                        continue
                    key = (schedule, pp, m, M)
                    if key not in splits:
                        splits[key] = _split(profile, schedule, pp, m, M, budget)
                    stages = splits[key]
                    if stages is None:
                        miss = _leaner(miss, needs, profile, schedule, dp, pp, m, M)
                        continue
                    layout = _layout(profile, stages, schedule, dp, pp, m, M, budget, usable)
                    if not layout.fits:  # Interleaved: the rank's stages together
                        miss = _leaner(miss, needs, profile, schedule, dp, pp, m, M)
                    elif best is None or layout.step_s < best.step_s:
                        best = layout
                if best is not None:
                    found.append(best)
    found = _undominated(found)
    found.sort(key=_order)
    return found, miss


def _undominated(found: list[Layout]) -> list[Layout]:
    """Per DP × PP, a schedule stays only if it is faster than the simpler ones before it in
    SCHEDULES: GPipe takes 1F1B's time with more micro-batches in flight, so it shows only when
    1F1B was not asked for; Interleaved1F1B only where its smaller bubble beats its extra sends."""
    fastest: dict[tuple[int, int], float] = {}
    kept = []
    for layout in sorted(found, key=lambda x: SCHEDULES.index(x.schedule)):
        key = (layout.dp, layout.pp)
        if layout.step_s < fastest.get(key, float("inf")):
            kept.append(layout)
            fastest[key] = layout.step_s
    return kept


def _order(layout: Layout) -> tuple[float, int, int, int]:
    return (
        round(layout.step_s, 12),
        layout.slots_used,
        layout.pp,
        SCHEDULES.index(layout.schedule),
    )


def _check(
    slots: Sequence[int],
    global_batch: int,
    budget: int | None,
    granularity: int,
    schedules: Sequence[str],
) -> None:
    problems = []
    if not slots or any(n < 0 for n in slots) or sum(slots) < 1:
        problems.append(f"slots {list(slots)} must be counts >= 0 per host, at least one slot")
    if global_batch < 1:
        problems.append(f"the global batch {global_batch} must be at least 1")
    if budget is not None and budget < 1:
        problems.append(f"the device memory {budget} must be a positive number of bytes")
    if granularity < 1:
        problems.append(f"the granularity {granularity} must be at least 1")
    unknown = [s for s in schedules if s not in SCHEDULES]
    if unknown or not schedules:
        problems.append(f"schedules {list(schedules)}: each must be one of {', '.join(SCHEDULES)}")
    if problems:
        raise UsageError("; ".join(problems), hint="see `ftrun plan --help`")


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _split(
    profile: Profile, schedule: str, pp: int, m: int, M: int, budget: int | None
) -> Stages | None:
    """The balanced split at micro-batch m; each stage checked alone against the budget."""
    times = [layer.time_s(m) for layer in profile.layers]
    k = pp * STAGES_PER_RANK[schedule]
    if budget is None:
        return balanced_split(times, k)

    def fits(stage: int, start: int, end: int) -> bool:
        flight = cost.in_flight(schedule, pp=pp, position=stage % pp, M=M)
        return cost.stage_memory(profile, start, end, m=m, in_flight=flight) <= budget

    return balanced_split(times, k, fits=fits)


def _layout(
    profile: Profile,
    stages: Stages,
    schedule: str,
    dp: int,
    pp: int,
    m: int,
    M: int,
    budget: int | None,
    usable: int,
) -> Layout:
    step = cost.step_cost(profile, stages, dp=dp, pp=pp, m=m, M=M)
    memory = tuple(
        cost.rank_memory(profile, stages, schedule=schedule, pp=pp, position=p, m=m, M=M)
        for p in range(pp)
    )
    return Layout(
        dp=dp,
        pp=pp,
        stages=stages,
        stages_per_rank=STAGES_PER_RANK[schedule],
        micro_batch=m,
        micro_batches=M,
        global_batch=dp * m * M,
        schedule=schedule,
        layer_names=profile.layer_names,
        step_s=step.step_s,
        compute_s=step.compute_s,
        bubble_s=step.bubble_s,
        allreduce_s=step.allreduce_s,
        p2p_s=step.p2p_s,
        memory_bytes=memory,
        device_memory_bytes=budget,
        slots_available=usable,
    )


def _leaner(
    miss: _Miss | None,
    needs: dict[tuple[str, int, int, int], int],
    profile: Profile,
    schedule: str,
    dp: int,
    pp: int,
    m: int,
    M: int,
) -> _Miss:
    """The leaner of `miss` and this layout split for time alone (what it would need)."""
    key = (schedule, pp, m, M)
    if key not in needs:
        stages = _split(profile, schedule, pp, m, M, None)
        assert stages is not None
        needs[key] = max(
            cost.rank_memory(profile, stages, schedule=schedule, pp=pp, position=p, m=m, M=M)
            for p in range(pp)
        )
    need = needs[key]
    if miss is not None and miss.memory_bytes <= need:
        return miss
    return _Miss(need, f"DP{dp}×PP{pp} {schedule} at micro-batch {m}")
