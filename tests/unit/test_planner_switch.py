"""The switch rule: grow only when the time saved over the horizon pays for the switch."""

from __future__ import annotations

import dataclasses

import pytest

from ftrun.planner import Layout, prefer_current_pp, should_switch


def layout(dp: int, pp: int, step_s: float) -> Layout:
    return Layout(
        dp=dp,
        pp=pp,
        stages=tuple((p, p + 1) for p in range(pp)),
        stages_per_rank=1,
        micro_batch=1,
        micro_batches=max(pp, 12 // dp),
        global_batch=dp * max(pp, 12 // dp),
        schedule="1F1B",
        layer_names=tuple(f"l{i}" for i in range(pp)),
        compute_s=step_s,
        bubble_s=0.0,
        allreduce_s=0.0,
        p2p_s=0.0,
        memory_bytes=(0,) * pp,
        device_memory_bytes=None,
        slots_available=16,
    )


@pytest.mark.parametrize(
    ("old", "new", "cost", "switch", "reason"),
    [
        # 600 × (1 − 0.31/0.42) = 157 s saved > 9.8 s
        (
            0.42,
            0.31,
            9.8,
            True,
            "grow to DP3×PP2 1F1B: 0.31 s/step vs 0.42 s/step saves 157 s over the next 600 s, "
            "more than the 9.8 s a switch costs",
        ),
        # 600 × 0.1 = 60 s < 120 s
        (
            1.0,
            0.9,
            120.0,
            False,
            "grow to DP3×PP2 1F1B: 0.9 s/step vs 1 s/step saves 60 s over the next 600 s, "
            "less than the 120 s a switch costs; stay on DP2×PP2 1F1B",
        ),
        # 3% faster: below the 5% hysteresis, however cheap the switch
        (
            1.0,
            0.97,
            0.0,
            False,
            "stay on DP2×PP2 1F1B: DP3×PP2 1F1B would take 0.97 s/step vs 1 s/step, "
            "3.0% faster, not more than the 5% needed to switch",
        ),
        (1.0, 1.2, 0.0, False, "no faster"),
    ],
)
def test_should_switch(old: float, new: float, cost: float, switch: bool, reason: str) -> None:
    decision = should_switch(
        layout(2, 2, old), layout(3, 2, new), switch_cost_s=cost, horizon_s=600
    )
    assert decision.switch is switch
    assert reason in decision.reason
    assert decision.gain_s == pytest.approx(600 * (1 - new / old))


def test_no_current_layout_starts_and_the_same_plan_stays() -> None:
    first = should_switch(None, layout(2, 2, 1.0), switch_cost_s=10, horizon_s=600)
    assert first.switch and first.reason.startswith("start with DP2×PP2 1F1B")
    same = layout(2, 2, 1.0)
    again = should_switch(
        same, dataclasses.replace(same, compute_s=0.5), switch_cost_s=0, horizon_s=600
    )
    assert not again.switch and "is the current plan" in again.reason


def test_prefer_current_pp() -> None:
    ranked = [layout(4, 2, 1.00), layout(2, 4, 1.03), layout(1, 4, 1.5)]
    assert prefer_current_pp(ranked, 4, within=0.05) is ranked[1]
    assert prefer_current_pp(ranked, 4, within=0.01) is ranked[0]
    assert prefer_current_pp(ranked, 3) is ranked[0]  # no layout of that depth
    with pytest.raises(ValueError):
        prefer_current_pp([], 2)
