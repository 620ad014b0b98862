"""The cost model on hand-computed examples: step time and its parts, memory per schedule."""

from __future__ import annotations

import dataclasses

import pytest

from ftrun.planner import LayerProfile, Links, Profile
from ftrun.planner.cost import (
    allreduce_s,
    in_flight,
    loss_s,
    rank_memory,
    reduce_s,
    step_cost,
    step_lower_bound,
)

LINKS = Links(
    allreduce_bytes_per_s=1e9, allreduce_latency_s=1e-3, p2p_bytes_per_s=1e8, p2p_latency_s=1e-4
)


def four_layers() -> Profile:
    """Each layer: (0.1 + 0.01 m) + (0.2 + 0.02 m) s, 4 MB of state (1 MB of gradients),
    5 kB of activations and 1 kB of output per sample."""
    layer = dict(
        fwd_s=(0.1, 0.01), bwd_s=(0.2, 0.02), state_bytes=4_000_000, act_bytes=5000, out_bytes=1000
    )
    return Profile(
        model="four",
        layers=tuple(LayerProfile(name=f"l{i}", **layer) for i in range(4)),  # type: ignore[arg-type]
        links=LINKS,
    )


def test_step_cost_by_hand() -> None:
    # DP2 × PP2, stages of 2 layers, m = 2, M = 4: a stage is 2 × (0.3 + 0.03·2) = 0.72 s.
    cost = step_cost(four_layers(), ((0, 2), (2, 4)), dp=2, pp=2, m=2, M=4)
    assert cost.compute_s == pytest.approx(4 * 0.72)
    assert cost.bubble_s == pytest.approx(1 * 0.72)
    # ring over 2: 2·1/2 × 2 MB / 1 GB/s + 2 × 1 ms
    assert cost.allreduce_s == pytest.approx(0.002 + 0.002)
    # one boundary, both ways: 2 × (2 samples × 1 kB / 100 MB/s + 0.1 ms)
    assert cost.p2p_s == pytest.approx(2 * (2e-5 + 1e-4))
    # the loss over the 4 ranks: up a tree of depth 2 and back, 4 × 1 ms
    assert cost.loss_s == pytest.approx(0.004)
    assert cost.step_s == pytest.approx(2.88 + 0.72 + 0.004 + 0.00024 + 0.004)


def with_step_costs(profile: Profile, opt_s: list[float], reduce_bytes_per_s: float) -> Profile:
    layers = tuple(
        dataclasses.replace(layer, opt_s=t) for layer, t in zip(profile.layers, opt_s, strict=True)
    )
    return dataclasses.replace(profile, layers=layers, reduce_bytes_per_s=reduce_bytes_per_s)


def test_the_devices_reduce_and_the_optimizer_step_by_hand() -> None:
    # Optimizer steps of 1, 2, 3 and 4 ms; the device reduces 250 MB/s.
    model = with_step_costs(four_layers(), [0.001, 0.002, 0.003, 0.004], 2.5e8)
    cost = step_cost(model, ((0, 2), (2, 4)), dp=2, pp=2, m=2, M=4)
    # the rank holding the most gradients (both 2 MB): 2·1/2 × 2 MB / 250 MB/s = 8 ms
    assert cost.reduce_s == pytest.approx(0.008)
    # the slowest rank's optimizer step: layers 2 and 3, 3 + 4 = 7 ms
    assert cost.optimizer_s == pytest.approx(0.007)
    assert cost.step_s == pytest.approx(2.88 + 0.72 + 0.004 + 0.00024 + 0.008 + 0.007 + 0.004)
    # DP4 × PP1: a ring of 4 moves 2·3/4 of the 4 MB of gradients through each rank
    one_stage = step_cost(model, ((0, 4),), dp=4, pp=1, m=2, M=4)
    assert one_stage.reduce_s == pytest.approx(1.5 * 4e6 / 2.5e8)
    assert one_stage.optimizer_s == pytest.approx(0.010)
    # one replica reduces nothing; a profile without the rate counts no reduce
    assert reduce_s(4_000_000, 1, 2.5e8) == 0 and reduce_s(4_000_000, 2, None) == 0
    # the lower bound the ranking prunes with stays below every split's cost
    bound = step_lower_bound(model, dp=2, pp=2, v=1, m=2, M=4)
    assert bound <= cost.step_s
    assert bound >= step_lower_bound(four_layers(), dp=2, pp=2, v=1, m=2, M=4) + 0.005 + 0.008


@pytest.mark.parametrize(
    ("world", "latencies"), [(1, 0), (2, 2), (3, 4), (4, 4), (5, 6), (1024, 20)]
)
def test_the_loss_all_reduce_is_a_tree_of_latencies(world: int, latencies: int) -> None:
    # Parallel.step all-reduces the mean loss over every rank, every step: one number, so
    # latency alone, 2⌈log2 world⌉ of them (not a ring's 2(world − 1): 2046 at 1024 ranks).
    assert loss_s(world, LINKS) == pytest.approx(latencies * 1e-3)
    dp, pp = (world, 1) if world in (1, 5) else (world // 2, 2) if world % 2 == 0 else (1, world)
    if world <= 4:
        stages = (
            ((0, 4),) if pp == 1 else tuple((i * 4 // pp, (i + 1) * 4 // pp) for i in range(pp))
        )
        cost = step_cost(four_layers(), stages, dp=dp, pp=pp, m=1, M=4)
        assert cost.loss_s == pytest.approx(latencies * 1e-3)
        bound = step_lower_bound(four_layers(), dp=dp, pp=pp, v=1, m=1, M=4)
        assert bound <= cost.step_s and bound >= latencies * 1e-3


def test_one_replica_pays_no_allreduce_and_one_stage_no_sends() -> None:
    cost = step_cost(four_layers(), ((0, 4),), dp=1, pp=1, m=1, M=8)
    assert cost.allreduce_s == 0 and cost.p2p_s == 0 and cost.bubble_s == 0
    assert cost.loss_s == 0  # one rank: nothing to all-reduce
    assert cost.compute_s == pytest.approx(8 * 4 * 0.33)
    assert allreduce_s(10**9, 1, LINKS) == 0


@pytest.mark.parametrize(
    ("schedule", "pp", "position", "M", "expected"),
    [
        ("GPipe", 4, 0, 8, 8),  # every forward first
        ("GPipe", 4, 3, 8, 8),
        ("1F1B", 4, 0, 8, 4),  # the first stage waits for the pipeline to fill
        ("1F1B", 4, 3, 8, 1),
        ("1F1B", 1, 0, 8, 1),  # gradient accumulation
        ("Interleaved1F1B", 4, 0, 8, 2 * 3 + 4 + 1),
        ("Interleaved1F1B", 4, 3, 8, 4 + 1),
        ("Interleaved1F1B", 4, 0, 4, 8),  # capped at v·M
    ],
)
def test_in_flight(schedule: str, pp: int, position: int, M: int, expected: int) -> None:
    assert in_flight(schedule, pp=pp, position=position, M=M) == expected


@pytest.mark.parametrize(
    ("schedule", "position", "expected"),
    [
        # state 8 MB + in flight × m=2 × (10 kB of activations + 1 kB received on stage 1)
        # + the gradient buffer of stage 0's output (2 × 1 kB)
        ("1F1B", 0, 8_000_000 + 2 * 2 * 10_000 + 2_000),
        ("1F1B", 1, 8_000_000 + 1 * 2 * 11_000),
        ("GPipe", 0, 8_000_000 + 4 * 2 * 10_000 + 2_000),
        ("GPipe", 1, 8_000_000 + 4 * 2 * 11_000),
    ],
)
def test_memory_by_hand(schedule: str, position: int, expected: int) -> None:
    stages = ((0, 2), (2, 4))
    got = rank_memory(four_layers(), stages, schedule=schedule, pp=2, position=position, m=2, M=4)
    assert got == expected


def test_interleaved_ranks_hold_both_their_stages_state() -> None:
    stages = ((0, 1), (1, 2), (2, 3), (3, 4))  # rank 0: stages 0 and 2; rank 1: 1 and 3
    got = rank_memory(four_layers(), stages, schedule="Interleaved1F1B", pp=2, position=0, m=1, M=2)
    flight = in_flight("Interleaved1F1B", pp=2, position=0, M=2)  # 2·1 + 2 + 1 = 5 → ≤ 4
    assert flight == 4
    # two layers' state; in-flight at the larger stage (stage 2: 5 kB + 1 kB received); 1 kB grad
    assert got == 8_000_000 + 4 * 1 * 6000 + 1000


def test_the_splits_constant_time_memory_is_stage_memory() -> None:
    from ftrun.planner.cost import StageMemories, stage_memory

    model = four_layers()
    table = StageMemories(model)
    for start in range(4):
        for end in range(start + 1, 5):
            for m, flight in ((1, 1), (2, 3), (8, 4)):
                expected = stage_memory(model, start, end, m=m, in_flight=flight)
                assert table(start, end, m=m, in_flight=flight) == expected
