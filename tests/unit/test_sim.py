"""ftrun.sim: traces read and checked, and jobs simulated through the controller's decisions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ftrun.errors import UsageError
from ftrun.jobview.goodput import account
from ftrun.journal.read import read_journal
from ftrun.planner import Profile
from ftrun.sim.baseline import Baseline, young_daly_interval_s
from ftrun.sim.costs import DEFAULT_COSTS, Costs, costs_from_journal
from ftrun.sim.ideal import ideal_goodput, speed_by_hosts
from ftrun.sim.run import CHECKPOINT_RESTART, FTRUN, IDEAL, Setup, simulate
from ftrun.sim.trace import parse_trace, read_trace

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
SMALL_4 = """0,add,node1
0,add,node2
0,add,node3
0,add,node4
60000,remove,node3
150000,add,node3
240000,remove,node2
330000,add,node5
"""
PROFILE = Path(__file__).resolve().parents[1] / "data" / "profile_gpt_small.json"
BASELINE = Baseline(detect_s=15.0, restart_s=10.0, checkpoint_every_s=60.0, checkpoint_stall_s=4.5)


def test_a_trace_is_read_in_order_with_who_is_up_when() -> None:
    trace = parse_trace("t_ms,action,node\n" + SMALL_4)
    assert len(trace.events) == 8 and trace.duration_s == 330.0
    assert trace.up_at(0) == ["node1", "node2", "node3", "node4"]
    assert trace.up_at(200) == ["node1", "node2", "node4", "node3"]
    assert trace.most_up() == 4
    assert trace.first_time_with(4) == 0.0
    assert trace.scaled(0.1).duration_s == pytest.approx(33.0)


def test_every_problem_of_a_bad_trace_is_named_with_its_line() -> None:
    with pytest.raises(UsageError) as e:
        parse_trace("0,add,a\n5,add,b\n3,add,c\n10,frob,d\n10,remove,z\n10,add,a\nx,y\n")
    message = e.value.message
    for needle in (
        "line 3: time goes back",
        "line 4: action 'frob'",
        "line 5: z is removed while it is not up",
        "line 6: a is added while it is up",
        "line 7: 2 fields",
    ):
        assert needle in message
    with pytest.raises(UsageError, match="no events"):
        parse_trace("# nothing\n")


def test_reading_a_missing_or_binary_trace_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read the trace"):
        read_trace(tmp_path / "nope.csv")
    (tmp_path / "bin.csv").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UsageError, match="not UTF-8"):
        read_trace(tmp_path / "bin.csv")


def setup(**kw: Any) -> Setup:
    return Setup(**{"costs": DEFAULT_COSTS, "baseline": BASELINE, "tail_s": 60.0, **kw})


def events_of(outcome: Any) -> list[dict[str, Any]]:
    return read_journal(outcome.job_dir).events


def test_small_4_through_the_controllers_decisions(tmp_path: Path) -> None:
    out = simulate(parse_trace(SMALL_4), setup(), work_dir=tmp_path)
    events = events_of(out[FTRUN])
    launched = [e["hosts"] for e in events if e["kind"] == "generation_launched"]
    # The roster's plans: shrink when node3 is lost, grow when it is back (it joins last:
    # node rank 0 stays), shrink when node2 is lost, grow onto node5.
    assert launched == [
        ["node1", "node2", "node3", "node4"],
        ["node1", "node2", "node4"],
        ["node1", "node2", "node4", "node3"],
        ["node1", "node4", "node3"],
        ["node1", "node4", "node3", "node5"],
    ]
    tiers = [e["tier"] for e in events if e["kind"] == "fault_classified"]
    assert tiers == ["replace-node", "replace-node"]  # the fault policy's, for a lost host
    assert [e["why"] for e in events if e["kind"] == "reconfigure"] == ["grow", "grow"]
    faults = [e for e in events if e["kind"] == "fault_detected"]
    assert [round(e["detected_t"] - e["fault_t"], 3) for e in faults] == [
        DEFAULT_COSTS.detect_s
    ] * 2
    report = account(events, running=False)
    # The trace and its tail, and the graceful stop at its end.
    assert report.job.wall_s == pytest.approx(330.0 + 60.0 + DEFAULT_COSTS.stop_s)
    assert report.job.productive_s + report.job.badput_s == pytest.approx(report.job.wall_s)
    # Three of four hosts trained twice for 90 s less a recovery: a quarter of that is lost.
    assert 0.25 * 120 < report.job.buckets["smaller_plan"] < 0.25 * 180
    ideal = out[IDEAL].goodput
    assert ideal == pytest.approx(1 - 0.25 * 180 / 390)
    assert 0.7 * ideal < out[FTRUN].goodput < ideal
    assert out[CHECKPOINT_RESTART].goodput < out[FTRUN].goodput


def test_the_baseline_restarts_on_every_change_and_loses_work_since_its_checkpoint(
    tmp_path: Path,
) -> None:
    out = simulate(parse_trace(SMALL_4), setup(), work_dir=tmp_path)
    events = events_of(out[CHECKPOINT_RESTART])
    restored = [e["step"] for e in events if e["kind"] == "checkpoint_restored"]
    commits = [e["step"] for e in events if e["kind"] == "checkpoint_committed"]
    assert len(restored) == 5 and restored[0] == 0
    assert set(restored[1:]) <= set(commits) | {0}  # only what a save wrote comes back
    detection = [e["detected_t"] - e["fault_t"] for e in events if e["kind"] == "fault_detected"]
    assert detection == [pytest.approx(15.0)] * 2
    assert account(events, running=False).job.buckets["recomputed"] > 30.0


def test_a_planned_job_asks_the_planner_whether_a_grow_pays(tmp_path: Path) -> None:
    profile = Profile.from_dict(json.loads(PROFILE.read_text()))
    trace = parse_trace(SMALL_4)
    kw = dict(profile=profile, profile_path=str(PROFILE), global_batch=512)
    # Over a 3 s horizon no grow pays for its restart (6 s of start-up at these costs): the
    # PlanDesk declines, journaled.
    out = simulate(trace, setup(replan_horizon_s=3.0, **kw), work_dir=tmp_path / "short")
    events = events_of(out[FTRUN])
    assert [e["kind"] for e in events].count("grow_declined") >= 1
    assert not [e for e in events if e["kind"] == "reconfigure"]
    plans = [e for e in events if e["kind"] == "plan_chosen"]
    assert plans and all(e["full_step_s"] == plans[0]["full_step_s"] for e in plans)
    # Over the default half hour both grows pay.
    out = simulate(trace, setup(**kw), work_dir=tmp_path / "long")
    assert [e["why"] for e in events_of(out[FTRUN]) if e["kind"] == "reconfigure"] == ["grow"] * 2


def test_ideal_is_the_time_average_of_what_the_hosts_up_could_do() -> None:
    trace = parse_trace("0,add,a\n0,add,b\n100000,remove,b\n")
    speed = speed_by_hosts(
        2, nproc_per_node=1, profile=None, global_batch=None, device_memory_bytes=None
    )
    assert ideal_goodput(trace, start_s=0.0, end_s=200.0, speed=speed) == pytest.approx(0.75)
    assert ideal_goodput(trace, start_s=100.0, end_s=200.0, speed=speed) == pytest.approx(0.5)


def test_young_daly_interval() -> None:
    assert young_daly_interval_s(4.5, 250.0) == pytest.approx((2 * 4.5 * 250) ** 0.5)


def test_costs_are_measured_from_a_journal() -> None:
    events = [
        {"kind": "job_started", "t": 0.0, "hosts": ["a", "b"], "nproc_per_node": 1},
        {"kind": "generation_launched", "t": 1.0, "gen": 1, "world_size": 2},
        {"kind": "first_step", "t": 4.0, "gen": 1, "step": 1},
        {"kind": "progress", "t": 14.0, "gen": 1, "step": 101, "stall_s": 0.5},
        {"kind": "generation_ended", "t": 15.8, "gen": 1, "step": 101, "outcome": "failed"},
        {
            "kind": "fault_detected",
            "t": 15.5,
            "incident": 1,
            "fault": "host-lost",
            "fault_t": 14.0,
            "detected_t": 15.5,
        },  # fmt: skip
        {"kind": "torn_down", "t": 15.8, "incident": 1},
        {"kind": "fence_wait", "t": 15.8, "wait_s": 3.5},  # older journals: not a cost now
        {"kind": "generation_launched", "t": 19.5, "gen": 2, "world_size": 1},
        {"kind": "checkpoint_restored", "t": 21.0, "gen": 2, "step": 25, "restore_s": 0.7},
        {"kind": "first_step", "t": 22.0, "gen": 2, "step": 26},
    ]
    costs = costs_from_journal(events)
    assert isinstance(costs, Costs)
    assert costs.detect_s == pytest.approx(1.5)
    assert costs.teardown_s == pytest.approx(0.3)
    assert costs.restore_s == pytest.approx(0.7)
    assert costs.relaunch_s == pytest.approx(22.0 - 19.5 - 0.7)
    assert costs.startup_s == pytest.approx(4.0)
    # Gen 1 ended at step 101 and gen 2 restored 25: 76 steps of 0.1 s were done again.
    assert costs.persist_lag_s == pytest.approx(7.6)
    assert costs.step_s == pytest.approx(0.1)
    assert costs.stall_share == pytest.approx(0.05)
    assert costs.agent_start_s == DEFAULT_COSTS.agent_start_s  # the journal never showed one


def test_a_grows_cost_counts_from_its_persist_request() -> None:
    events = [
        {"kind": "persist_requested", "t": 30.0, "gen": 1, "why": "grow", "step": 50},
        {"kind": "persist_committed", "t": 31.5, "gen": 1, "step": 52},
        {"kind": "reconfigure", "t": 31.5, "gen": 1, "why": "grow", "step": 52},
        {"kind": "generation_ended", "t": 33.0, "gen": 1, "step": 52, "outcome": "reconfigured"},
        {"kind": "reconfigure", "t": 60.0, "gen": 2, "why": "grow", "step": 90},  # no persist
        {"kind": "generation_ended", "t": 62.0, "gen": 2, "step": 90, "outcome": "reconfigured"},
    ]
    assert costs_from_journal(events).reconfigure_s == pytest.approx((3.0 + 2.0) / 2)


@pytest.mark.skipif(not (TRACES / "bamboo-g4dn.csv").exists(), reason="no shared traces")
def test_the_bamboo_trace_runs_in_well_under_a_second_per_strategy(tmp_path: Path) -> None:
    trace = read_trace(TRACES / "bamboo-g4dn.csv")
    out = simulate(trace, setup(), work_dir=tmp_path)
    assert out[FTRUN].incidents == sum(
        1 for e in events_of(out[FTRUN]) if e["kind"] == "fault_detected"
    )
    assert 0 < out[CHECKPOINT_RESTART].goodput < out[FTRUN].goodput < out[IDEAL].goodput
