"""Ranking layouts: the table cases of the planner (budget, granularity, unequal slots, errors)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftrun.errors import EXIT_USAGE, UsageError
from ftrun.planner import (
    LayerProfile,
    Links,
    NoLayoutFits,
    Profile,
    best_layout,
    parse_size,
    place_ranks,
    rank_layouts,
)
from ftrun.planner.rank import MAX_GLOBAL_BATCH

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "profile_gpt_small.json"
GiB = 1024**3


# The keys of the FTRUN_PLAN document (docs/planner.md, the contract ftrun.parallel reads).
PLAN_KEYS = {
    "version",
    "dp",
    "pp",
    "stages",
    "stages_per_rank",
    "layer_names",
    "micro_batch",
    "micro_batches",
    "global_batch",
    "schedule",
    "mesh",
    "predicted_step_s",
}


def sample() -> Profile:
    return Profile.from_dict(json.loads(SAMPLE.read_text()))


def uniform(n: int, *, state: int = 10**6, act: int = 1000, out: int = 100) -> Profile:
    layer = dict(fwd_s=(0.001, 0.001), bwd_s=(0.002, 0.002), state_bytes=state, act_bytes=act)
    return Profile(
        model="uniform",
        layers=tuple(
            LayerProfile(name=f"l{i}", out_bytes=out, **layer)  # type: ignore[arg-type]
            for i in range(n)
        ),
        links=Links(p2p_latency_s=0.0, allreduce_latency_s=0.0),
    )


def test_the_sample_on_four_hosts() -> None:
    ranked = rank_layouts(
        sample(), slots=[8, 8, 8, 7], global_batch=512, device_memory_bytes=16 * GiB
    )
    best = ranked[0]
    assert (best.dp, best.pp, best.schedule) == (8, 3, "1F1B")
    assert best.stages == ((0, 5), (5, 9), (9, 10))
    assert (best.micro_batch, best.micro_batches) == (8, 8)
    assert best.slots_used == 24 and best.spares == 7
    assert [x.step_s for x in ranked] == sorted(x.step_s for x in ranked)


def test_to_plan_is_the_contract() -> None:
    best = best_layout(sample(), slots=[4, 4], global_batch=48, device_memory_bytes=None)
    plan = best.to_plan()
    assert set(plan) == PLAN_KEYS
    assert plan["version"] == 1
    assert plan["dp"] * plan["micro_batch"] * plan["micro_batches"] == plan["global_batch"] == 48
    assert plan["mesh"] == [
        [d * plan["pp"] + p for p in range(plan["pp"])] for d in range(plan["dp"])
    ]
    assert plan["layer_names"] == list(sample().layer_names)
    assert len(plan["stages"]) == plan["pp"] * plan["stages_per_rank"]
    assert json.loads(json.dumps(plan)) == plan


def test_a_model_that_does_not_fit_one_device_needs_a_pipeline() -> None:
    # 8 layers of 1 GiB state: 8 GiB in all, 3 GiB per device.
    model = uniform(8, state=GiB)
    ranked = rank_layouts(model, slots=[4], global_batch=8, device_memory_bytes=3 * GiB)
    assert ranked and all(x.pp >= 3 for x in ranked)
    assert all(x.fits for x in ranked)
    best = ranked[0]
    assert max(end - start for start, end in best.stages) <= 2


def test_memory_picks_a_smaller_micro_batch() -> None:
    model = uniform(4, state=0, act=GiB // 8)
    free = best_layout(model, slots=[1], global_batch=16, device_memory_bytes=None)
    tight = best_layout(model, slots=[1], global_batch=16, device_memory_bytes=GiB)
    assert free.micro_batch == 16  # fixed costs amortised over one big micro-batch
    assert tight.micro_batch == 2 and tight.max_memory_bytes <= GiB


@pytest.mark.parametrize("granularity", [1, 2, 4, 8])
def test_granularity(granularity: int) -> None:
    ranked = rank_layouts(
        uniform(8),
        slots=[8, 8, 8],
        global_batch=64,
        device_memory_bytes=None,
        granularity=granularity,
    )
    assert ranked
    assert all(x.slots_used % granularity == 0 and x.slots_used <= 24 for x in ranked)


def test_unequal_slots_count_their_sum_and_place_ranks_in_host_order() -> None:
    ranked = rank_layouts(uniform(8), slots=[4, 3], global_batch=14, device_memory_bytes=None)
    assert max(x.slots_used for x in ranked) == 7  # DP7 × PP1
    assert place_ranks([4, 3], 7) == ((0, 1, 2, 3), (4, 5, 6))
    assert place_ranks([4, 3, 2], 6) == ((0, 1, 2, 3), (4, 5), ())
    with pytest.raises(ValueError):
        place_ranks([1, 1], 3)


def test_the_global_batch_is_kept_exactly() -> None:
    # 7 is prime: only DP1 or DP7; PP ≤ M means PP ≤ 7 with m = 1.
    ranked = rank_layouts(uniform(4), slots=[8], global_batch=7, device_memory_bytes=None)
    assert {(x.dp, x.micro_batch * x.micro_batches) for x in ranked} <= {(1, 7), (7, 1)}
    assert all(x.dp * x.micro_batch * x.micro_batches == 7 for x in ranked)


def test_interleaving_shows_where_its_smaller_bubble_pays() -> None:
    ranked = rank_layouts(uniform(16), slots=[4], global_batch=4, device_memory_bytes=None)
    by_schedule = {(x.pp, x.schedule): x for x in ranked}
    interleaved, plain = by_schedule[(4, "Interleaved1F1B")], by_schedule[(4, "1F1B")]
    assert interleaved.stages_per_rank == 2 and len(interleaved.stages) == 8
    assert interleaved.bubble_s == pytest.approx(plain.bubble_s / 2)
    assert interleaved.step_s < plain.step_s
    assert not any(x.schedule == "GPipe" for x in ranked)  # never faster than 1F1B


def test_ties_go_to_fewer_slots_then_shallower() -> None:
    # Free layers and free links: every layout predicts 0 s, so only the tie-breaks order them.
    layer = dict(fwd_s=(0, 0), bwd_s=(0, 0), state_bytes=0, act_bytes=0, out_bytes=0)
    free = Links(allreduce_latency_s=0, p2p_latency_s=0)
    model = Profile(
        model="t",
        layers=tuple(LayerProfile(name=f"l{i}", **layer) for i in range(2)),  # type: ignore[arg-type]
        links=free,
    )
    ranked = rank_layouts(model, slots=[2], global_batch=4, device_memory_bytes=None)
    assert [(x.dp, x.pp, x.schedule) for x in ranked] == [
        (1, 1, "1F1B"),
        (2, 1, "1F1B"),
        (1, 2, "1F1B"),
    ]


def test_no_layout_fits_says_why() -> None:
    with pytest.raises(NoLayoutFits) as caught:
        best_layout(
            sample(),
            slots=[8, 8],
            global_batch=512,
            device_memory_bytes=parse_size("300MiB"),
        )
    e = caught.value
    assert e.exit_code == EXIT_USAGE
    assert e.message.startswith("no layout fits 300.0 MiB per device: the leanest tried, ")
    assert "PP10 1F1B at micro-batch 1" in e.message
    assert "layer 'tok' alone holds 594.9 MiB of state" in e.message
    assert "--device-memory" in e.hint and "more slots" in e.hint
    assert (
        rank_layouts(
            sample(), slots=[8, 8], global_batch=512, device_memory_bytes=parse_size("300MiB")
        )
        == []
    )


def test_no_layout_keeps_the_batch() -> None:
    with pytest.raises(NoLayoutFits, match="keeps the global batch of 3 on 4 slots"):
        best_layout(uniform(4), slots=[4], global_batch=3, device_memory_bytes=None, granularity=4)


def test_bad_arguments_are_named_together() -> None:
    with pytest.raises(UsageError) as caught:
        rank_layouts(
            uniform(2),
            slots=[],
            global_batch=0,
            device_memory_bytes=None,
            granularity=0,
            schedules=["ZeroBubble"],
        )
    assert caught.value.message.count(";") == 3


@pytest.mark.parametrize(
    ("slots", "batch", "needle"),
    [
        ([8, 8], 10**16, "the global batch 10000000000000000 must be 1 to 16,777,216"),
        ([8] * 9000, 1024, "72,000 slots: the planner ranks layouts of 65,536 at most"),
    ],
)
def test_inputs_past_the_bounds_are_refused_at_once(slots, batch, needle) -> None:
    """`ftrun plan --global-batch 10**16` ran for ever, dividing the batch by trial (issue 34)."""
    with pytest.raises(UsageError, match=needle):
        rank_layouts(
            uniform(2),
            slots=slots,
            global_batch=batch,
            device_memory_bytes=None,
            granularity=1,
            schedules=["1F1B"],
        )


def test_the_largest_batch_and_fleet_are_ranked() -> None:
    ranked = rank_layouts(
        uniform(2),
        slots=[8] * 8192,
        global_batch=MAX_GLOBAL_BATCH,
        device_memory_bytes=None,
        granularity=8,
        schedules=["1F1B"],
    )
    assert ranked and ranked[0].global_batch == MAX_GLOBAL_BATCH
