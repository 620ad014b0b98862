"""The planner and the ranks agree on memory: every layout the planner says fits passes the
budget check the rank that runs it makes (ftrun/inflight.py is the one count of micro-batches
in flight; a rank refusing its plan would end the job at start)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftrun.inflight import in_flight
from ftrun.parallel import Plan
from ftrun.parallel.memory import check_budget
from ftrun.planner import Profile, rank_layouts

PROFILE = Path(__file__).resolve().parents[1] / "data" / "profile_gpt_small.json"


@pytest.mark.parametrize("budget_gib", [1, 2, 16])
@pytest.mark.parametrize("hosts", [2, 3, 4, 8])
def test_every_layout_the_planner_fits_passes_the_ranks_check(budget_gib, hosts):
    profile = Profile.from_dict(json.loads(PROFILE.read_text()))
    budget = budget_gib << 30
    layouts = rank_layouts(profile, slots=[1] * hosts, global_batch=64, device_memory_bytes=budget)
    assert layouts or budget_gib == 1
    for layout in layouts:
        plan = Plan.from_dict(layout.to_plan())
        for position in range(plan.pp):
            stages = [plan.stages[s] for s in plan.virtual_stages(position)]
            layers = [profile.layers[i] for a, b in stages for i in range(a, b)]
            check_budget(
                plan,
                position,
                state_bytes=sum(x.state_bytes for x in layers),
                act_bytes_per_sample=sum(x.act_bytes for x in layers),
                budget=budget,
                rank=position,
            )


def test_in_flight_per_schedule():
    assert in_flight("GPipe", pp=4, position=0, micro_batches=8) == 8
    assert [in_flight("1F1B", pp=4, position=p, micro_batches=8) for p in range(4)] == [4, 3, 2, 1]
    assert in_flight("1F1B", pp=4, position=0, micro_batches=2) == 2
    # Megatron-LM's warm-up: 2(PP - p - 1) + (v - 1)PP + 1, at most v*M.
    assert in_flight("Interleaved1F1B", pp=4, position=0, micro_batches=8, v=2) == 11
    assert in_flight("Interleaved1F1B", pp=4, position=3, micro_batches=8, v=2) == 5
    assert in_flight("1F1B", pp=1, position=0, micro_batches=8) == 1
