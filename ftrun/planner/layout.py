"""A DP × PP layout: what the planner chose, what it predicts, and the FTRUN_PLAN it becomes.

Owns the FTRUN_PLAN contract (docs/planner.md) from the planner's side: `Layout.to_plan()` is the
document the controller puts in every rank's environment, and `place_ranks` says which host each
rank lands on. The figures beside the plan (step time and its parts, memory per pipeline
position) are the planner's predictions, kept for `ftrun plan` and the journal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ftrun import plandoc
from ftrun.plandoc import PlanDoc

# A predicted step's parts, each a field of cost.StepCost and of Layout: the step is their sum.
STEP_TERMS = (
    "compute_s",
    "bubble_s",
    "allreduce_s",
    "p2p_s",
    "reduce_s",
    "optimizer_s",
    "loss_s",
)


def step_total(parts: object) -> float:
    """The step that `parts` (a StepCost or a Layout) predicts: the sum of its STEP_TERMS."""
    return sum(getattr(parts, term) for term in STEP_TERMS)


PLAN_VERSION = plandoc.VERSION

GPIPE = "GPipe"
ONE_F_ONE_B = "1F1B"
INTERLEAVED = "Interleaved1F1B"
# torch.distributed.pipelining's names, in the order ties are broken (1F1B holds fewer
# micro-batches than GPipe for the same time; interleaving is the most moving parts).
SCHEDULES: tuple[str, ...] = (ONE_F_ONE_B, GPIPE, INTERLEAVED)
# Virtual stages per pipeline rank under each schedule.
STAGES_PER_RANK = {GPIPE: 1, ONE_F_ONE_B: 1, INTERLEAVED: 2}


@dataclass(frozen=True, kw_only=True)
class Layout:
    """dp replicas of a pp-deep pipeline; `stages` are half-open layer ranges, one per virtual
    stage (pp × stages_per_rank of them); pipeline rank p holds stages p, p + pp, …

    `memory_bytes[p]` is the predicted peak of pipeline rank p (the same in every replica).
    """

    dp: int
    pp: int
    stages: tuple[tuple[int, int], ...]
    stages_per_rank: int
    micro_batch: int
    micro_batches: int
    global_batch: int
    schedule: str
    layer_names: tuple[str, ...]
    compute_s: float
    bubble_s: float
    allreduce_s: float
    p2p_s: float
    memory_bytes: tuple[int, ...]
    device_memory_bytes: int | None
    slots_available: int
    reduce_s: float = 0.0
    optimizer_s: float = 0.0
    loss_s: float = 0.0

    @property
    def step_s(self) -> float:
        """The predicted step: the sum of its parts (cost.StepCost's)."""
        return step_total(self)

    @property
    def name(self) -> str:
        return f"DP{self.dp}×PP{self.pp}"

    @property
    def slots_used(self) -> int:
        return self.dp * self.pp

    @property
    def spares(self) -> int:
        return self.slots_available - self.slots_used

    @property
    def max_memory_bytes(self) -> int:
        return max(self.memory_bytes)

    @property
    def fits(self) -> bool:
        budget = self.device_memory_bytes
        return budget is None or self.max_memory_bytes <= budget

    @property
    def stage_text(self) -> str:
        """`0-3|4-7`: each virtual stage's first and last layer (inclusive), in stage order."""
        return "|".join(
            f"{start}" if end - start == 1 else f"{start}-{end - 1}" for start, end in self.stages
        )

    def same_plan(self, other: Layout) -> bool:
        """The same ranks doing the same work: switching between the two would change nothing."""

        def work(doc: PlanDoc) -> dict[str, Any]:
            return {k: v for k, v in doc.items() if k != "predicted_step_s"}

        return work(self.to_plan()) == work(other.to_plan())

    def to_plan(self) -> PlanDoc:
        """The FTRUN_PLAN document (ftrun/plandoc.py)."""
        return {
            "version": PLAN_VERSION,
            "dp": self.dp,
            "pp": self.pp,
            "stages": [[start, end] for start, end in self.stages],
            "stages_per_rank": self.stages_per_rank,
            "layer_names": list(self.layer_names),
            "micro_batch": self.micro_batch,
            "micro_batches": self.micro_batches,
            "global_batch": self.global_batch,
            "schedule": self.schedule,
            "mesh": [[d * self.pp + p for p in range(self.pp)] for d in range(self.dp)],
            "predicted_step_s": self.step_s,
        }

    def figures(self) -> dict[str, Any]:
        """The predictions beside the plan (for `ftrun plan --json` and the journal)."""
        return {
            "step_s": self.step_s,
            "compute_s": self.compute_s,
            "bubble_s": self.bubble_s,
            "allreduce_s": self.allreduce_s,
            "p2p_s": self.p2p_s,
            "reduce_s": self.reduce_s,
            "optimizer_s": self.optimizer_s,
            "loss_s": self.loss_s,
            "memory_bytes": list(self.memory_bytes),
            "device_memory_bytes": self.device_memory_bytes,
            "fits": self.fits,
            "slots_used": self.slots_used,
            "spares": self.spares,
        }


def place_ranks(slots: Sequence[int], world: int) -> tuple[tuple[int, ...], ...]:
    """Global ranks per host when `world` ranks fill the hosts in order, each up to its slots.

    Rank d·pp + p is pipeline position p of replica d, so a replica's stages sit on consecutive
    ranks: on one host where it fits (stage sends stay inside the host) and the DP all-reduce
    crosses hosts. With unequal slots (a host lost a device) the later hosts take fewer ranks;
    torchrun gives every host the same nproc, so the controller launches a layout whose world is
    nproc × hosts (see `granularity` in rank.py) and this map is then regular.
    """
    if world > sum(slots):
        raise ValueError(f"{world} ranks do not fit in {sum(slots)} slots")
    placed: list[tuple[int, ...]] = []
    rank = 0
    for n in slots:
        take = min(n, world - rank)
        placed.append(tuple(range(rank, rank + take)))
        rank += take
    return tuple(placed)
