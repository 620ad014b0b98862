"""A planner that learns (planner/calibrate.py, controller/plan_learning.py): a factor learned
from a plan's measured step time, the cost per message fitted to it for plans not measured, a
grow refused when the calibrated plan is no faster, and the link check's figures in place of the
defaults."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from ftrun.config import LaunchConfig
from ftrun.controller.generation import Reconfigure
from ftrun.controller.planning import PROFILE_FILE, PlanDesk, plan_desk, summary
from ftrun.journal import Journal
from ftrun.journal.read import read_events
from ftrun.planner import Layout, Links, should_switch
from ftrun.planner.calibrate import (
    Calibration,
    StepMeter,
    layout_messages,
    measured_links,
    plan_key,
)
from ftrun.planner.cost import messages

PROFILE = Path(__file__).resolve().parents[1] / "data" / "profile_gpt_small.json"
HOSTS = ["n1", "n2", "n3", "n4"]


def layout(dp: int, pp: int, step_s: float, schedule: str = "1F1B", M: int = 0) -> Layout:
    v = 2 if schedule == "Interleaved1F1B" else 1
    M = M or max(pp, 12 // dp)
    return Layout(
        dp=dp,
        pp=pp,
        stages=tuple((s, s + 1) for s in range(pp * v)),
        stages_per_rank=v,
        micro_batch=1,
        micro_batches=M,
        global_batch=dp * M,
        schedule=schedule,
        layer_names=tuple(f"l{i}" for i in range(pp * v)),
        compute_s=step_s * 0.75,
        bubble_s=step_s * 0.25,
        allreduce_s=0.0,
        p2p_s=0.0,
        memory_bytes=(0,) * pp,
        device_memory_bytes=None,
        slots_available=16,
    )


def test_a_measured_plan_is_predicted_at_its_own_factor():
    cal = Calibration()
    four = layout(2, 2, 0.1)
    assert cal.factor(four).source == "uncalibrated" and cal.apply(four) is four
    m = cal.learn(four, measured_s=0.3, steps=10)
    assert m.factor == pytest.approx(3.0) and m.plan == plan_key(four)
    assert cal.apply(four).step_s == pytest.approx(0.3)  # every term scaled alike
    assert cal.apply(four).compute_s == pytest.approx(0.225)
    assert cal.factor(four).source == "measured"
    cal.learn(four, measured_s=0.2, steps=20)  # measured again: the latest figure counts
    assert cal.apply(four).step_s == pytest.approx(0.2) and len(cal.measured) == 1


@pytest.mark.parametrize(
    ("pp", "v", "M", "expected"),
    [
        # 1F1B, 2 ranks: rank 0 sends each micro-batch's activation and receives its gradient.
        (2, 1, 4, 4 * 2),
        # 3 ranks: the middle one receives and sends both ways, 4 a micro-batch.
        (3, 1, 4, 4 * 4),
        (4, 1, 8, 8 * 4),
        # Interleaved, 2 ranks × 2 virtual stages (0-3): rank 0 holds 0 (sends, receives a
        # gradient: 2) and 2 (4), rank 1 holds 1 (4) and 3 (2): 6 a micro-batch, 3× 1F1B's.
        (2, 2, 4, 4 * 6),
        # 4 ranks × 2 (stages 0-7): rank 1 holds 1 and 5, both inside the pipeline: 8.
        (4, 2, 4, 4 * 8),
        (1, 1, 8, 0),  # no pipeline: nothing sent
    ],
)
def test_messages_count_the_busiest_ranks_sends_and_receives(pp, v, M, expected):
    assert messages(pp=pp, v=v, M=M) == expected


def test_a_plan_not_measured_is_predicted_with_the_cost_per_message():
    # bench_reconfig's first two plans: the 4-rank Interleaved plan measured, the 3-rank 1F1B
    # plan not: its compute as the model has it, its messages at what the first one's cost.
    cal = Calibration()
    inter = layout(2, 2, 0.10, "Interleaved1F1B", M=4)
    assert layout_messages(inter) == 24
    cal.learn(inter, measured_s=0.22, steps=30)  # 0.12 s beyond the model: 5 ms a message
    three = layout(1, 3, 0.20, M=4)  # 16 messages: 0.20 + 16 × 5 ms
    got = cal.apply(three)
    assert got.step_s == pytest.approx(0.28)
    assert got.compute_s == pytest.approx(three.compute_s)  # the profile's compute as it is
    assert got.p2p_s == pytest.approx(0.08)  # the messages counted with the sends
    factor = cal.factor(three)
    assert factor.value == pytest.approx(1.4)
    assert factor.source.startswith("per message (16 messages × 5.00 ms) from DP2×PP2")
    assert cal.factor(inter).source == "measured"  # its own measurement first


def test_the_cost_per_message_is_fitted_to_every_plan_measured():
    cal = Calibration()
    cal.learn(layout(2, 2, 0.10, "Interleaved1F1B", M=4), measured_s=0.22, steps=30)  # 24, +0.12
    cal.learn(layout(2, 2, 0.10, M=4), measured_s=0.10, steps=30)  # 8 messages, +0
    # Least squares: (24 × 0.12 + 8 × 0) / (24² + 8²) = 2.88 / 640 = 4.5 ms a message.
    assert cal.terms() is not None and cal.terms().message_s == pytest.approx(0.0045)
    assert cal.apply(layout(1, 4, 0.2, M=8)).step_s == pytest.approx(0.2 + 32 * 0.0045)
    cal.learn(layout(2, 2, 0.10, M=4), measured_s=0.14, steps=30)  # measured again: the latest
    assert len(cal.measured) == 2
    assert cal.terms().message_s == pytest.approx((24 * 0.12 + 8 * 0.04) / 640)


def test_without_a_cost_per_message_one_factor_scales_every_term():
    dp_only = Calibration()
    dp_only.learn(layout(2, 1, 0.1), measured_s=0.3, steps=10)  # no messages: x3
    four = dp_only.apply(layout(4, 1, 0.2))
    assert four.step_s == pytest.approx(0.6) and four.compute_s == pytest.approx(0.45)
    assert dp_only.factor(layout(4, 1, 0.2)).source.startswith("from DP2×PP1")
    faster = Calibration()  # a pipeline measured faster than the model: no cost to a message
    faster.learn(layout(1, 2, 0.2), measured_s=0.15, steps=10)
    faster.learn(layout(1, 3, 0.2), measured_s=0.17, steps=10)
    got = faster.apply(layout(1, 4, 0.4))  # (0.15 + 0.17) / (0.2 + 0.2) = x0.8
    assert got.step_s == pytest.approx(0.32) and got.p2p_s == 0.0


def test_the_calibrated_ranking_puts_a_plan_measured_slow_behind():
    cal = Calibration()
    fast_on_paper, slower_on_paper = layout(1, 4, 0.10), layout(1, 3, 0.14)
    cal.learn(fast_on_paper, measured_s=0.38, steps=10)  # 4 ranks on 2 cores
    cal.learn(slower_on_paper, measured_s=0.28, steps=10)
    ranked = [model for _, model in cal.rank([fast_on_paper, slower_on_paper])]
    assert ranked == [slower_on_paper, fast_on_paper]


def test_a_grow_whose_calibrated_plan_is_slower_is_refused():
    cal = Calibration()
    three, four = layout(1, 3, 0.198), layout(1, 4, 0.128)
    # The model alone grows: 35 % faster.
    assert should_switch(three, four, switch_cost_s=2.0, horizon_s=3600).switch
    cal.learn(four, measured_s=0.384, steps=30)  # generation 1 ran it
    cal.learn(three, measured_s=0.279, steps=30)  # generation 2 runs this
    decision = should_switch(cal.apply(three), cal.apply(four), switch_cost_s=2.0, horizon_s=3600)
    assert not decision.switch and "no faster" in decision.reason
    # Not faster by the margin (5 %) is not taken either.
    cal.learn(four, measured_s=0.279 * 0.97, steps=30)
    assert not should_switch(
        cal.apply(three), cal.apply(four), switch_cost_s=0, horizon_s=3600
    ).switch


def test_the_step_meter_leaves_the_warm_up_out_and_waits_for_steady_steps():
    meter = StepMeter()
    meter.sample(11, 100.0, first=True)  # restored step 10: the first step is 11
    meter.sample(12, 105.0)  # warm-up: a slow second step
    assert meter.step_s() is None and not meter.steady()
    meter.sample(13, 105.0)  # the reference
    meter.sample(16, 106.2)
    assert not meter.steady()  # 3 steps
    meter.sample(21, 108.2)
    assert meter.steady() and meter.steps == 8
    assert meter.step_s() == pytest.approx(0.4)
    slow = StepMeter()
    for step, t in ((1, 0.0), (3, 40.0), (4, 80.0)):  # 40 s a step: one step in 30 s will do
        slow.sample(step, t)
    assert slow.steady() and slow.step_s() == pytest.approx(40.0)


def test_measured_links_replace_the_defaults_only():
    got = measured_links(Links(), latency_s=0.0004, bandwidth_Bps=3e9)
    assert got == Links(
        allreduce_bytes_per_s=3e9,
        allreduce_latency_s=0.0002,
        p2p_bytes_per_s=3e9,
        p2p_latency_s=0.0002,
    )
    stated = Links(allreduce_bytes_per_s=10e9, p2p_bytes_per_s=20e9)  # the profile says so
    kept = measured_links(stated, latency_s=None, bandwidth_Bps=3e9)
    assert kept == stated


# ---- the plan desk, learning from its journal --------------------------------------------------


class Quiet:
    def rank_output(self, rank: int, lines: list[str]) -> None: ...
    def torchrun_output(self, host: str, lines: list[str]) -> None: ...
    def notice(self, text: str, *, level: str = "info") -> None: ...


def learning_desk(tmp_path: Path) -> tuple[PlanDesk, Journal]:
    cfg = LaunchConfig(
        job_id="j",
        job_name="j",
        run_dir=tmp_path,
        script="train.py",
        hosts=tuple(HOSTS),
        transport="ssh",
        profile=str(PROFILE),
        global_batch=64,
        device_memory_bytes=2 << 30,
        replan_horizon_s=3600.0,
    )
    journal = Journal(cfg.job_dir)
    shutil.copyfile(PROFILE, cfg.job_dir / PROFILE_FILE)
    made = plan_desk(cfg, journal=journal, reporter=Quiet())
    assert isinstance(made, PlanDesk)
    made.torn_down(1.0)
    return made, journal


def steps(journal: Journal, gen: int, step_s: float) -> None:
    """Generation `gen` steps, step_s apart, as the watcher journals it: 4 s past the warm-up."""
    n = 3 + max(6, math.ceil(4.0 / step_s))
    for i in range(n):
        journal.clock = lambda t=1000.0 + i * step_s: t
        journal.record("progress" if i else "first_step", gen=gen, step=i + 1)
    journal.clock = lambda: 2000.0


def kinds(journal: Journal, kind: str) -> list[dict]:
    return [e for e in read_events(journal.job_dir) if e["kind"] == kind]


def test_the_desk_learns_each_generation_and_refuses_a_grow_measured_slower(tmp_path):
    plans, journal = learning_desk(tmp_path)
    plans.choose(HOSTS, gen=1, why="launch")
    four = plans.current
    assert four is not None
    steps(journal, 1, 3.0 * four.step_s)  # the 4-host plan runs 3x slower than the model says
    [cal1] = kinds(journal, "plan_calibrated")
    assert cal1["gen"] == 1 and cal1["factor"] == pytest.approx(3.0, rel=1e-3)
    assert cal1["summary"] == summary(four) and not cal1["final"]

    plans.choose(HOSTS[:2], gen=2, why="n3, n4 lost")  # generation 1 learned for good
    two = plans.current
    assert two is not None
    chosen = kinds(journal, "plan_chosen")[-1]
    # Not measured: the model's step plus its messages at the 4-host plan's cost per message
    # (all it measured beyond the model, over its messages).
    per_message = 2.0 * four.step_s / layout_messages(four)
    assert chosen["calibration"]["source"].startswith("per message")
    assert chosen["predicted_step_s"] == pytest.approx(
        two.step_s + layout_messages(two) * per_message, rel=1e-3
    )
    assert chosen["model_step_s"] == pytest.approx(two.step_s)
    grow = Reconfigure("grow", "n3, n4 ready")
    assert plans.gate(grow, HOSTS[:2], HOSTS[2:]) is None  # waits for generation 2's steps
    assert not kinds(journal, "grow_declined")
    # Generation 2 runs faster than the model (0.8x): the 4-host plan is measured slower, and
    # the others, each at its messages' fitted cost, are no faster. The model alone would grow.
    steps(journal, 2, 0.8 * two.step_s)
    n4, n2 = layout_messages(four), layout_messages(two)
    fitted = (n4 * 2.0 * four.step_s - n2 * 0.2 * two.step_s) / (n4 * n4 + n2 * n2)
    for other in plans.ranked(4):
        if plans.calibration.factor(other).source == "measured":
            continue  # the two plans measured: at their own figures
        assert plans.calibration.apply(other).step_s == pytest.approx(
            other.step_s + layout_messages(other) * fitted, rel=1e-3
        )
        assert plans.calibration.apply(other).step_s > 0.8 * two.step_s
    assert plans.gate(grow, HOSTS[:2], HOSTS[2:]) is None
    [declined] = kinds(journal, "grow_declined")
    assert "calibrated" in declined["reason"] and "measured" in declined["reason"]
    assert declined["predicted_step_s"] > 0.8 * two.step_s


def four_then_two(plans, journal, factor: float):
    """Generation 1 on the 4 hosts runs `factor` x the model's step time; then n3 and n4 are lost
    and generation 2 is planned on 2: the two plans."""
    plans.choose(HOSTS, gen=1, why="launch")
    four = plans.current
    assert four is not None
    steps(journal, 1, factor * four.step_s)
    plans.choose(HOSTS[:2], gen=2, why="n3, n4 lost")
    two = plans.current
    assert two is not None
    return four, two


def test_the_desk_grows_when_the_calibrated_plan_is_faster(tmp_path):
    plans, journal = learning_desk(tmp_path)
    four, two = four_then_two(plans, journal, 1.2)
    assert two.step_s > 1.3 * four.step_s  # the model: 4 hosts pay
    steps(journal, 2, 1.2 * two.step_s)
    change = plans.gate(Reconfigure("grow", "n3, n4 ready"), HOSTS[:2], HOSTS[2:])
    assert change is not None and "grow" in change.detail and "calibrated" in change.detail


def test_the_link_check_figures_replace_the_defaults(tmp_path):
    plans, journal = learning_desk(tmp_path)
    plans.profile = plans.profile.__class__(
        model=plans.profile.model, layers=plans.profile.layers
    )  # no links stated: the defaults
    journal.record("link_check", check=1, typical_latency_s=0.0004, typical_bandwidth_Bps=2e9)
    plans.choose(HOSTS, gen=1, why="launch")
    [chosen] = kinds(journal, "plan_chosen")
    assert chosen["links"]["measured"] is True
    assert chosen["links"]["allreduce_bytes_per_s"] == 2e9
    assert chosen["links"]["p2p_latency_s"] == pytest.approx(0.0002)
    assert json.dumps(chosen)  # journaled whole


def test_a_grow_is_weighed_on_the_running_plans_latest_steps(tmp_path):
    plans, journal = learning_desk(tmp_path)
    _, two = four_then_two(plans, journal, 3.0)
    grow = Reconfigure("grow", "n3, n4 ready")
    # Steady at first at 5x the model (slower than the 4-host plan measured) ...
    for i in range(9):
        journal.clock = lambda t=1000.0 + i * 5.0 * two.step_s: t
        journal.record("progress" if i else "first_step", gen=2, step=i + 1)
    assert plans.learning is not None and not plans.learning.waiting()
    # ... then at 0.6x the model's pace for long: the latest steps count, and the grow is
    # declined (as in the test above).
    t0 = 1000.0 + 8 * 5.0 * two.step_s
    for i in range(1, 200):
        journal.clock = lambda t=t0 + i * 0.6 * two.step_s: t
        journal.record("progress", gen=2, step=9 + i)
    assert plans.gate(grow, HOSTS[:2], HOSTS[2:]) is None
    [declined] = kinds(journal, "grow_declined")
    assert "stay" in declined["reason"]
