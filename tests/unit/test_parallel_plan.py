"""ftrun.parallel's plan: parsing and validation (FTRUN_PLAN, contract version 1), a rank's
coordinates, its stages, the data range of each replica, the memory budget's arithmetic."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
import torch.nn as nn

from ftrun import envcontract, plandoc
from ftrun.parallel import BudgetError, Plan, PlanError, parse_bytes
from ftrun.parallel.memory import check_budget, in_flight
from ftrun.parallel.stages import check_layers, cut
from ftrun.planner import Profile, best_layout

NAMES = ["tok", "block0", "block1", "block2", "block3", "head"]


def plan_doc(dp: int = 2, pp: int = 2, spr: int = 1, m: int = 2, mbs: int = 4, **over):
    n_stages = pp * spr
    cuts = [round(i * len(NAMES) / n_stages) for i in range(n_stages + 1)]
    doc = {
        "version": 1,
        "dp": dp,
        "pp": pp,
        "stages": [[cuts[i], cuts[i + 1]] for i in range(n_stages)],
        "stages_per_rank": spr,
        "layer_names": NAMES,
        "micro_batch": m,
        "micro_batches": mbs,
        "global_batch": dp * m * mbs,
        "schedule": "Interleaved1F1B" if spr > 1 else "1F1B",
        "mesh": [[d * pp + p for p in range(pp)] for d in range(dp)],
        "predicted_step_s": 0.41,
        "some_future_key": "ignored",
    }
    doc.update(over)
    return doc


def test_parses_the_contract_example_and_round_trips():
    plan = Plan.from_json(json.dumps(plan_doc()))
    assert (plan.dp, plan.pp, plan.world, plan.replica_batch) == (2, 2, 4, 8)
    assert plan.stages == ((0, 3), (3, 6))
    assert plan.stage_layers(1) == ("block2", "block3", "head")
    assert Plan.from_dict(plan.to_dict()) == plan


def test_from_env_is_none_without_a_plan():
    assert Plan.from_env({}) is None
    plan = Plan.from_env({envcontract.PLAN: json.dumps(plan_doc())})
    assert plan is not None and plan.schedule == "1F1B"


@pytest.mark.parametrize(
    ("over", "words"),
    [
        ({"version": 2}, ["version 2"]),
        ({"global_batch": 17}, ["global_batch 17 != dp x micro_batch x micro_batches"]),
        ({"stages": [[0, 2], [3, 6]]}, ["stage 1 [3, 6)"]),
        ({"stages": [[0, 3], [3, 5]]}, ["cover layers 0..5, not all 6"]),
        ({"stages": [[0, 6]]}, ["1 stages, but pp x stages_per_rank = 2"]),
        ({"mesh": [[0, 2], [1, 3]]}, ["row-major"]),
        ({"schedule": "ZeroBubble"}, ["schedule 'ZeroBubble'"]),
        ({"micro_batches": 1, "global_batch": 4}, ["micro_batches 1 < pp 2"]),
        ({"stages_per_rank": 2}, ["needs schedule Interleaved1F1B", "4"]),
        ({"dp": 0}, ["dp must be >= 1"]),
        ({"global_batch": "many"}, ["'many' is not an integer"]),
    ],
)
def test_invalid_plans_are_refused_with_what_is_wrong(over, words):
    with pytest.raises(PlanError) as info:
        Plan.from_dict(plan_doc(**over))
    for word in words:
        assert word in info.value.message


def test_every_problem_in_one_message():
    with pytest.raises(PlanError) as info:
        Plan.from_dict(plan_doc(version=3, schedule="x", mesh=[[1, 0], [2, 3]]))
    assert all(w in info.value.message for w in ("version 3", "schedule 'x'", "row-major"))


@pytest.mark.parametrize("text", ["", "{", "[1]", '{"dp": 1}'])
def test_malformed_documents(text):
    with pytest.raises(PlanError):
        Plan.from_json(text) if text else Plan.from_dict([])  # type: ignore[arg-type]


def test_coords_follow_the_mesh():
    plan = Plan.from_dict(plan_doc(dp=2, pp=3, mbs=3))
    assert [plan.coords(r) for r in range(6)] == [(d, p) for d in range(2) for p in range(3)]
    for d, row in enumerate(plan.mesh):
        for p, rank in enumerate(row):
            assert plan.coords(rank) == (d, p)
    with pytest.raises(PlanError):
        plan.coords(6)


def test_interleaved_positions_hold_every_pp_th_stage():
    plan = Plan.from_dict(plan_doc(dp=1, pp=2, spr=2, m=1, mbs=4))
    assert plan.virtual_stages(0) == (0, 2) and plan.virtual_stages(1) == (1, 3)


@pytest.mark.parametrize(
    ("dp", "pp", "m", "mbs"), [(1, 1, 4, 2), (2, 1, 2, 3), (2, 2, 1, 4), (3, 2, 2, 2), (4, 1, 1, 1)]
)
def test_data_ranges_cover_each_global_batch_exactly_once(dp, pp, m, mbs):
    plan = Plan.from_dict(plan_doc(dp=dp, pp=pp, m=m, mbs=mbs))
    for step in range(3):
        seen = sorted(i for d in range(dp) for i in plan.sample_range(step, d))
        b = plan.global_batch
        assert seen == list(range(step * b, (step + 1) * b))
        assert all(len(plan.sample_range(step, d)) == m * mbs for d in range(dp))


def test_data_position_is_layout_free():
    """The same step covers the same global samples under any layout with the same batch."""
    a = Plan.from_dict(plan_doc(dp=2, pp=1, m=2, mbs=4))
    b = Plan.dp_only(4, 16, 1, layer_names=NAMES)
    for step in range(3):
        assert {i for d in range(2) for i in a.sample_range(step, d)} == {
            i for d in range(4) for i in b.sample_range(step, d)
        }


def test_dp_only():
    plan = Plan.dp_only(3, 24, 2, layer_names=NAMES)
    assert (plan.dp, plan.pp, plan.micro_batches, plan.stages) == (3, 1, 4, ((0, 6),))
    assert plan.mesh == ((0,), (1,), (2,))
    with pytest.raises(PlanError, match="does not split"):
        Plan.dp_only(3, 16, 2, layer_names=NAMES)


def model() -> nn.Module:
    net = nn.Module()
    for name in NAMES:
        net.add_module(name, nn.Linear(2, 2))
    return net


def test_layers_must_match_the_models_children():
    plan = Plan.from_dict(plan_doc(layer_names=[*NAMES[:-1], "lm_head"]))
    with pytest.raises(PlanError, match="top-level children"):
        check_layers(plan, model())


def test_a_stage_keeps_the_full_models_names():
    full = model()
    keys = set(full.state_dict())
    plan = Plan.from_dict(plan_doc(dp=1, pp=2, spr=2, m=1, mbs=4))
    seen: set[str] = set()
    for position in range(2):
        part, stages = cut(model(), plan, position)
        assert len(stages) == 2
        assert set(part.state_dict()) == {k for s in stages for k in s.state_dict()}
        seen |= set(part.state_dict())
    assert seen == keys


@pytest.mark.parametrize(
    ("text", "value"),
    [("64MiB", 64 * 2**20), ("1.5GB", 1_500_000_000), ("4096", 4096), ("2g", 2 * 2**30)],
)
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


def test_parse_bytes_refuses_nonsense():
    with pytest.raises(PlanError, match="not a size"):
        parse_bytes("lots")


def test_budget():
    plan = Plan.from_dict(plan_doc(dp=1, pp=2, m=2, mbs=4))
    assert in_flight(plan, 0) == 2 and in_flight(plan, 1) == 1
    need = check_budget(plan, 0, state_bytes=1000, act_bytes_per_sample=10, budget=2000, rank=0)
    assert need == 1000 + 10 * 2 * 2
    with pytest.raises(BudgetError, match="memory budget"):
        check_budget(plan, 0, state_bytes=1000, act_bytes_per_sample=10, budget=1000, rank=0)


def test_parallel_imports_neither_the_cli_nor_the_controller():
    """ftrun.parallel runs inside ranks, like ftrun.checkpoint (STYLE.md: imports point one way)."""
    import ast
    from pathlib import Path

    import ftrun.parallel

    banned = ("ftrun.cli", "ftrun.controller", "ftrun.agent", "ftrun.planner", "typer", "rich")
    for path in Path(ftrun.parallel.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names] if isinstance(node, ast.Import)
                else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            )  # fmt: skip
            for name in names:
                assert not name.startswith(banned), f"{path.name} imports {name}"


def test_the_planner_writes_what_a_rank_reads():
    """One contract (ftrun/plandoc.py): every key the planner writes is the PlanDoc's, every
    key a reader requires is written, and the document reads back as the same layout."""
    sample = Path(__file__).resolve().parents[1] / "data" / "profile_gpt_small.json"
    profile = Profile.from_dict(json.loads(sample.read_text()))
    layout = best_layout(profile, slots=[2, 2], global_batch=32, device_memory_bytes=None)
    doc = layout.to_plan()
    assert set(doc) == set(typing.get_type_hints(plandoc.PlanDoc))
    assert set(plandoc.REQUIRED) <= set(doc)
    plan = Plan.from_dict(doc)
    assert (plan.dp, plan.pp, plan.version) == (layout.dp, layout.pp, plandoc.VERSION)
    assert plan.to_dict() == doc
