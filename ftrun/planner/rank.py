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

import functools
from collections.abc import Sequence

from ftrun.errors import UsageError
from ftrun.planner import cost
from ftrun.planner.layout import SCHEDULES, STAGES_PER_RANK, Layout
from ftrun.planner.profile import Profile
from ftrun.planner.split import Stages, balanced_split
from ftrun.units import format_bytes

# Bounds that keep `ftrun plan` to seconds: layouts are ranked over every divisor of the batch
# per replica (trial division to its square root) and every DP degree the slots allow. 16 Mi
# samples a step and 64 Ki devices are past any job today; `--global-batch 10**16` ran for ever.
MAX_GLOBAL_BATCH = 1 << 24
MAX_SLOTS = 1 << 16

_HINT_MEMORY = (
    "more slots (a deeper pipeline spreads the layers thinner), a larger --device-memory, "
    "or a smaller global batch"
)


class NoLayoutFits(UsageError):
    """No layout keeps the global batch within the slots and the memory budget; says why."""


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
    search = _Search(profile, device_memory_bytes, sum(slots))
    return search.rank(slots, global_batch, granularity, schedules)


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
    search = _Search(profile, device_memory_bytes, sum(slots))
    ranked = search.rank(slots, global_batch, granularity, schedules, only_best=True)
    if ranked:
        return ranked[0]
    usable = sum(slots)
    miss = search.leanest_miss()
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
        f"{miss[1]}, needs {format_bytes(miss[0])} on its fullest device "
        f"(layer {largest.name!r} alone holds {format_bytes(largest.state_bytes)} of state)",
        hint=_HINT_MEMORY,
        data={"budget_bytes": device_memory_bytes, "leanest_bytes": miss[0]},
    )


class _Search:
    """One ranking: the splits it has made (shared across DP degrees) and the layouts that
    missed the budget (costed only if nothing fits, for NoLayoutFits)."""

    def __init__(self, profile: Profile, budget: int | None, usable: int) -> None:
        self.profile = profile
        self.budget = budget
        self.usable = usable
        self.memories = cost.StageMemories(profile)
        # A split depends on the stage count, m and what each position holds in flight (1F1B's
        # does not depend on M, so one split serves every DP).
        self.splits: dict[tuple[int, int, tuple[int, ...]], Stages | None] = {}
        self.misses: set[tuple[str, int, int, int, int]] = set()

    def rank(
        self,
        slots: Sequence[int],
        global_batch: int,
        granularity: int,
        schedules: Sequence[str],
        *,
        only_best: bool = False,
    ) -> list[Layout]:
        """Every fitting layout, ranked; with `only_best`, layouts that cannot beat the best
        found so far are not costed (the first is still the best, the rest incomplete)."""
        _check(slots, global_batch, self.budget, granularity, schedules)
        cutoff = float("inf")
        n_layers = len(self.profile.layers)
        found: list[Layout] = []
        for pp in range(1, min(n_layers, self.usable) + 1):
            for dp in range(self.usable // pp, 0, -1):
                if (dp * pp) % granularity or global_batch % dp:
                    continue
                for schedule in schedules:
                    v = STAGES_PER_RANK[schedule]
                    if v > 1 and (pp < 2 or n_layers < v * pp):
                        continue
                    best = self._fastest_m(schedule, dp, pp, global_batch // dp, cutoff)
                    if best is not None:
                        found.append(best)
                        if only_best:
                            cutoff = min(cutoff, best.step_s)
        found = _undominated(found)
        found.sort(key=_order)
        return found

    def _fastest_m(
        self, schedule: str, dp: int, pp: int, per_replica: int, cutoff: float
    ) -> Layout | None:
        """The fastest micro-batch size that fits (ties: the smaller m). Sizes whose lower bound
        is slower than the best so far, or than `cutoff`, are not split at all."""
        v = STAGES_PER_RANK[schedule]
        sizes = [
            (cost.step_lower_bound(self.profile, dp=dp, pp=pp, v=v, m=m, M=per_replica // m), m)
            for m in _divisors(per_replica)
            if per_replica // m >= pp and not (v > 1 and (per_replica // m) % pp)
        ]
        best: Layout | None = None
        for bound, m in sorted(sizes):
            # Pruned only when surely slower, at the precision the ranking compares (_order):
            # a tie there is broken by slots, so a tied layout must still be costed.
            if round(bound, 12) > round(min(cutoff, best.step_s if best else cutoff), 12):
                break
            layout = self._layout(schedule, dp, pp, m, per_replica // m)
            if layout is None:
                continue
            if best is None or (layout.step_s, m) < (best.step_s, best.micro_batch):
                best = layout
        return best

    def _layout(self, schedule: str, dp: int, pp: int, m: int, M: int) -> Layout | None:
        v = STAGES_PER_RANK[schedule]
        flights = tuple(cost.in_flight(schedule, pp=pp, position=p, M=M) for p in range(pp))
        key = (pp * v, m, flights if self.budget is not None else ())
        if key not in self.splits:
            self.splits[key] = _split(self.profile, self.memories, pp * v, m, flights, self.budget)
        stages = self.splits[key]
        layout = None
        if stages is not None:
            layout = _layout(self.profile, stages, schedule, dp, pp, m, M, self.budget, self.usable)
        if layout is None or not layout.fits:  # Interleaved: the rank's stages together
            self.misses.add((schedule, dp, pp, m, M))
            return None
        return layout

    def leanest_miss(self) -> tuple[int, str] | None:
        """Of the layouts that missed the budget, the one that would need the least memory when
        split for time alone: (bytes, a description)."""
        leanest: tuple[int, str] | None = None
        for schedule, dp, pp, m, M in sorted(self.misses):
            times = [layer.time_s(m) for layer in self.profile.layers]
            stages = balanced_split(times, pp * STAGES_PER_RANK[schedule])
            assert stages is not None, "without a memory check every split is possible"
            need = max(
                cost.rank_memory(
                    self.profile, stages, schedule=schedule, pp=pp, position=p, m=m, M=M
                )
                for p in range(pp)
            )
            if leanest is None or need < leanest[0]:
                leanest = (need, f"DP{dp}×PP{pp} {schedule} at micro-batch {m}")
        return leanest


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
    if not 1 <= global_batch <= MAX_GLOBAL_BATCH:
        problems.append(f"the global batch {global_batch} must be 1 to {MAX_GLOBAL_BATCH:,}")
    if sum(slots) > MAX_SLOTS:
        problems.append(f"{sum(slots):,} slots: the planner ranks layouts of {MAX_SLOTS:,} at most")
    if budget is not None and budget < 1:
        problems.append(f"the device memory {budget} must be a positive number of bytes")
    if granularity < 1:
        problems.append(f"the granularity {granularity} must be at least 1")
    unknown = [s for s in schedules if s not in SCHEDULES]
    if unknown or not schedules:
        problems.append(f"schedules {list(schedules)}: each must be one of {', '.join(SCHEDULES)}")
    if problems:
        raise UsageError("; ".join(problems), hint="see `ftrun plan --help`")


@functools.cache  # asked once per DP degree and schedule, for the same few batches
def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _split(
    profile: Profile,
    memories: cost.StageMemories,
    k: int,
    m: int,
    flights: tuple[int, ...],
    budget: int | None,
) -> Stages | None:
    """The balanced split into k virtual stages at micro-batch m; each stage checked alone
    against the budget, holding what its pipeline position holds in flight."""
    times = [layer.time_s(m) for layer in profile.layers]
    if budget is None:
        return balanced_split(times, k)
    pp = len(flights)

    def fits(stage: int, start: int, end: int) -> bool:
        return memories(start, end, m=m, in_flight=flights[stage % pp]) <= budget

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
        compute_s=step.compute_s,
        bubble_s=step.bubble_s,
        allreduce_s=step.allreduce_s,
        p2p_s=step.p2p_s,
        reduce_s=step.reduce_s,
        optimizer_s=step.optimizer_s,
        loss_s=step.loss_s,
        memory_bytes=memory,
        device_memory_bytes=budget,
        slots_available=usable,
    )
