"""The DP x PP plan a rank runs under: parsed from FTRUN_PLAN, or made DP-only without one.

The plan is the contract between the planner (which writes it, /work/contract-12.md) and the
runtime (which obeys it). Everything a rank needs to know about the layout is derived here, from
the plan alone, so every rank derives the same answers: its coordinates, the layers of each
(virtual) stage, and which global samples its replica trains on in a step. The data position is
the global sample count (step s covers [s*B, (s+1)*B)), never a per-rank position, which is what
lets a run continue under another layout without skipping or repeating a sample.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ftrun import envcontract, plandoc
from ftrun.errors import UsageError

SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B")


class PlanError(UsageError):
    """A plan that cannot be run: malformed, inconsistent, or not for this model or world."""


@dataclass(frozen=True, kw_only=True)
class Plan:
    """One DP x PP layout (FTRUN_PLAN, version 1). Validated on creation."""

    dp: int
    pp: int
    stages: tuple[tuple[int, int], ...]  # half-open layer ranges, len = pp * stages_per_rank
    stages_per_rank: int
    layer_names: tuple[str, ...]
    micro_batch: int  # m
    micro_batches: int  # M, per step per DP replica
    global_batch: int  # B = dp * m * M
    schedule: str
    mesh: tuple[tuple[int, ...], ...]  # mesh[d][p] = global rank
    predicted_step_s: float | None = None
    version: int = 1

    def __post_init__(self) -> None:
        problems = _problems(self)
        if problems:
            raise PlanError(
                "invalid plan: " + "; ".join(problems),
                hint=f"check ${envcontract.PLAN} against the plan contract (version 1)",
            )

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Plan:
        """From the JSON document; unknown keys are ignored (the contract's rule for readers)."""
        if not isinstance(doc, Mapping):
            raise PlanError(f"invalid plan: a JSON object was expected, not {type(doc).__name__}")
        missing = [k for k in plandoc.REQUIRED if k not in doc]
        if missing:
            raise PlanError(f"invalid plan: missing {', '.join(missing)}")
        try:
            return cls(
                version=int(doc.get("version", plandoc.VERSION)),
                dp=_int(doc["dp"]),
                pp=_int(doc["pp"]),
                stages=tuple((_int(a), _int(b)) for a, b in doc["stages"]),
                stages_per_rank=_int(doc.get("stages_per_rank", 1)),
                layer_names=tuple(str(n) for n in doc["layer_names"]),
                micro_batch=_int(doc["micro_batch"]),
                micro_batches=_int(doc["micro_batches"]),
                global_batch=_int(doc["global_batch"]),
                schedule=str(doc["schedule"]),
                mesh=tuple(tuple(_int(r) for r in row) for row in doc["mesh"]),
                predicted_step_s=(
                    None if doc.get("predicted_step_s") is None else float(doc["predicted_step_s"])
                ),
            )
        except (TypeError, ValueError) as e:
            raise PlanError(f"invalid plan: {e}") from None

    @classmethod
    def from_json(cls, text: str) -> Plan:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(f"invalid plan: not JSON ({e})") from None
        return cls.from_dict(doc)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Plan | None:
        """The plan in $FTRUN_PLAN, or None when it is not set (plain torchrun or python)."""
        text = environ.get(envcontract.PLAN, "").strip()
        return cls.from_json(text) if text else None

    @classmethod
    def dp_only(
        cls, world: int, global_batch: int, micro_batch: int, *, layer_names: Sequence[str]
    ) -> Plan:
        """The plan of a run without FTRUN_PLAN: every rank a full replica (dp = world, pp = 1)."""
        per_replica, rest = divmod(global_batch, world)
        if global_batch <= 0 or micro_batch <= 0 or rest or per_replica % micro_batch:
            raise PlanError(
                f"global batch {global_batch} does not split into {world} replica(s) of "
                f"micro-batches of {micro_batch}",
                hint="the global batch must be a multiple of world size x micro-batch",
            )
        names = tuple(layer_names)
        return cls(
            dp=world,
            pp=1,
            stages=((0, len(names)),),
            stages_per_rank=1,
            layer_names=names,
            micro_batch=micro_batch,
            micro_batches=per_replica // micro_batch,
            global_batch=global_batch,
            schedule="GPipe",
            mesh=tuple((d,) for d in range(world)),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "dp": self.dp,
            "pp": self.pp,
            "stages": [list(s) for s in self.stages],
            "stages_per_rank": self.stages_per_rank,
            "layer_names": list(self.layer_names),
            "micro_batch": self.micro_batch,
            "micro_batches": self.micro_batches,
            "global_batch": self.global_batch,
            "schedule": self.schedule,
            "mesh": [list(row) for row in self.mesh],
            "predicted_step_s": self.predicted_step_s,
        }

    # -- what a rank derives -----------------------------------------------------------------------
    @property
    def world(self) -> int:
        return self.dp * self.pp

    @property
    def replica_batch(self) -> int:
        """Samples per step per DP replica (M micro-batches of m)."""
        return self.global_batch // self.dp

    def coords(self, rank: int) -> tuple[int, int]:
        """(d, p): the rank's DP replica and pipeline position, its place in `mesh`."""
        if not 0 <= rank < self.world:
            raise PlanError(f"rank {rank} is outside the plan's {self.dp} x {self.pp} mesh")
        return rank // self.pp, rank % self.pp

    def virtual_stages(self, position: int) -> tuple[int, ...]:
        """The stages pipeline position p holds: p, p + pp, p + 2pp, ... (one unless interleaved)."""
        return tuple(position + k * self.pp for k in range(self.stages_per_rank))

    def stage_layers(self, stage: int) -> tuple[str, ...]:
        start, stop = self.stages[stage]
        return self.layer_names[start:stop]

    def sample_range(self, step: int, replica: int) -> range:
        """Global sample indices replica d trains on in step s (0-based):
        [s*B + d*B/dp, s*B + (d+1)*B/dp), in M micro-batches of m, in order."""
        start = step * self.global_batch + replica * self.replica_batch
        return range(start, start + self.replica_batch)


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise ValueError(f"{value!r} is not an integer")
    return int(value)


def _problems(plan: Plan) -> list[str]:
    """Everything wrong with a plan, so that one message reports it all."""
    out: list[str] = []
    if plan.version != 1:
        out.append(f"version {plan.version} (only 1 is known)")
    sizes = ("dp", "pp", "stages_per_rank", "micro_batch", "micro_batches", "global_batch")
    small = [
        f"{name} must be >= 1, not {getattr(plan, name)}"
        for name in sizes
        if getattr(plan, name) < 1
    ]
    if small:  # the checks below would divide by them or index with them
        return out + small
    if plan.schedule not in SCHEDULES:
        out.append(f"schedule {plan.schedule!r} is not one of {', '.join(SCHEDULES)}")
    if plan.stages_per_rank > 1 and plan.schedule != "Interleaved1F1B":
        out.append(f"stages_per_rank {plan.stages_per_rank} > 1 needs schedule Interleaved1F1B")
    if plan.global_batch != plan.dp * plan.micro_batch * plan.micro_batches:
        out.append(
            f"global_batch {plan.global_batch} != dp x micro_batch x micro_batches "
            f"= {plan.dp} x {plan.micro_batch} x {plan.micro_batches}"
        )
    if plan.pp > 1 and plan.micro_batches < plan.pp:
        out.append(f"micro_batches {plan.micro_batches} < pp {plan.pp}")
    if plan.schedule == "Interleaved1F1B" and plan.micro_batches % plan.pp:
        out.append(f"Interleaved1F1B needs micro_batches ({plan.micro_batches}) % pp == 0")
    n_layers = len(plan.layer_names)
    if len(set(plan.layer_names)) != n_layers:
        out.append("layer_names has duplicates")
    if len(plan.stages) != plan.pp * plan.stages_per_rank:
        out.append(
            f"{len(plan.stages)} stages, but pp x stages_per_rank = "
            f"{plan.pp * plan.stages_per_rank}"
        )
    at = 0
    for i, (start, stop) in enumerate(plan.stages):
        if start != at or stop <= start:
            out.append(f"stage {i} [{start}, {stop}) does not continue at layer {at} non-empty")
            break
        at = stop
    else:
        if at != n_layers:
            out.append(f"stages cover layers 0..{at}, not all {n_layers}")
    want = [[d * plan.pp + p for p in range(plan.pp)] for d in range(plan.dp)]
    if [list(row) for row in plan.mesh] != want:
        out.append(f"mesh {[list(r) for r in plan.mesh]} is not the row-major {want}")
    return out
