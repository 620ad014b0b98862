"""The FTRUN_PLAN document: the one contract between the planner, which writes it, and a rank
(ftrun.parallel), which reads it. Both take its keys and version from here rather than each
spelling them (docs/planner.md describes each key). Ground floor: imports nothing of ftrun.

A reader ignores keys it does not know (a newer writer may add some) and requires REQUIRED.
"""

from __future__ import annotations

from typing import TypedDict

VERSION = 1


class PlanDoc(TypedDict):
    version: int
    dp: int
    pp: int
    stages: list[list[int]]  # half-open layer ranges [start, end), pp * stages_per_rank of them
    stages_per_rank: int
    layer_names: list[str]
    micro_batch: int  # m
    micro_batches: int  # M, per step per DP replica
    global_batch: int  # dp * m * M
    schedule: str
    mesh: list[list[int]]  # mesh[d][p] = global rank
    predicted_step_s: float | None


# What a reader cannot do without; version, stages_per_rank and predicted_step_s have defaults.
REQUIRED = (
    "dp",
    "pp",
    "stages",
    "layer_names",
    "micro_batch",
    "micro_batches",
    "global_batch",
    "schedule",
    "mesh",
)
