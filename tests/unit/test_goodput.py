"""Goodput from journals with known timings: every bucket, per generation and for the job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ftrun.jobview import fold
from ftrun.jobview.goodput import BUCKETS, account, job_goodput


def ev(kind: str, t: float, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "t": t, **fields}


def started(t: float = 0.0, hosts: int = 2, nproc: int = 1, run: int = 1) -> dict[str, Any]:
    return ev(
        "job_started", t, hosts=[f"h{i}" for i in range(hosts)], nproc_per_node=nproc, run=run
    )


def launched(gen: int, t: float, world: int = 2) -> dict[str, Any]:
    return ev("generation_launched", t, gen=gen, hosts=["h0", "h1"][: max(1, world)],
              world_size=world)  # fmt: skip


def steps(gen: int, t0: float, first: int, last: int, dt: float = 1.0, **extra: Any) -> list:
    """first_step at t0, then a progress event per step up to `last`, `dt` apart."""
    out = [ev("first_step", t0, gen=gen, step=first)]
    out += [
        ev("progress", t0 + (s - first) * dt, gen=gen, step=s, **extra)
        for s in range(first + 1, last + 1)
    ]
    return out


def fault(gen: int, fault_t: float, detected_t: float, step: int, incident: int = 1) -> list:
    return [
        ev(
            "fault_detected",
            detected_t,
            incident=incident,
            gen=gen,
            fault="crash",
            fault_t=fault_t,
            detected_t=detected_t,
            step=step,
        ),  # fmt: skip
        ev("fault_classified", detected_t, incident=incident, tier="restart-in-place"),
    ]


def assert_adds_up(share: Any) -> None:
    assert share.productive_s + sum(share.buckets.values()) == pytest.approx(share.wall_s)
    assert all(v >= -1e-9 for v in share.buckets.values())


def test_a_clean_job_is_start_up_training_and_shutdown() -> None:
    events = [
        started(0.0),
        launched(1, 2.0),
        *steps(1, 5.0, 1, 101),  # steps 2..101 over 100 s
        ev("generation_ended", 106.0, gen=1, outcome="succeeded", step=101),
        ev("job_finished", 107.0, state="succeeded"),
    ]
    report = account(events, running=False)
    job = report.job
    assert job.wall_s == pytest.approx(107.0)
    assert job.buckets["startup"] == pytest.approx(5.0)
    assert job.buckets["teardown"] == pytest.approx(1.0)
    assert job.productive_s == pytest.approx(101.0)
    assert job.ratio == pytest.approx(101.0 / 107.0)
    assert_adds_up(job)


def crash_and_restart(restore_s: float = 0.5) -> list[dict[str, Any]]:
    """Gen 1 steps 1..58 from t=3 (dies at t=60, detected at 60.2, torn down at 61); gen 2
    launched at 62 restores step 50 (restore_s), first step 51 at 64, steps to 100 by 113."""
    return [
        started(0.0),
        launched(1, 1.0),
        *steps(1, 3.0, 1, 58),
        *fault(1, 60.0, 60.2, 58),
        ev("torn_down", 61.0, incident=1, gen=1),
        ev("generation_ended", 61.0, gen=1, outcome="failed", step=58),
        ev("restart", 61.5, incident=1, next_gen=2),
        launched(2, 62.0),
        ev("checkpoint_restored", 63.0, gen=2, step=50, tier="memory", restore_s=restore_s),
        *steps(2, 64.0, 51, 100),
        ev("generation_ended", 113.0, gen=2, outcome="succeeded", step=100),
        ev("job_finished", 114.0, state="succeeded"),
    ]


def test_a_crash_splits_into_its_phases_and_the_lost_steps() -> None:
    report = account(crash_and_restart(), running=False)
    g1, g2 = report.generations[1], report.generations[2]
    assert g1.buckets["startup"] == pytest.approx(3.0)
    assert g1.buckets["detection"] == pytest.approx(0.2)
    assert g1.buckets["teardown"] == pytest.approx(0.8)
    assert g1.buckets["waiting_for_hosts"] == pytest.approx(1.0)
    # 57 s of training ran steps 2..58; gen 2 restored 50, so 8 steps' time was done again.
    assert g1.buckets["recomputed"] == pytest.approx(8.0)
    assert g1.productive_s == pytest.approx(49.0)
    assert g2.buckets["relaunch"] == pytest.approx(1.5)
    assert g2.buckets["restore"] == pytest.approx(0.5)
    assert g2.productive_s == pytest.approx(49.0)
    assert g2.buckets["teardown"] == pytest.approx(1.0)
    assert report.job.wall_s == pytest.approx(114.0)
    assert report.job.productive_s == pytest.approx(98.0)
    for share in (g1, g2, report.job):
        assert_adds_up(share)


def test_without_a_restore_report_the_first_step_tells_what_was_kept() -> None:
    events = [e for e in crash_and_restart() if e["kind"] != "checkpoint_restored"]
    report = account(events, running=False)
    # First step 51 again: 50 kept, as with the report; no restore bucket.
    assert report.generations[1].buckets["recomputed"] == pytest.approx(8.0)
    assert report.generations[2].buckets["restore"] == 0.0
    assert report.generations[2].buckets["relaunch"] == pytest.approx(2.0)


def test_a_script_that_starts_over_recomputes_everything() -> None:
    events = crash_and_restart()
    events = [e for e in events if e["kind"] != "checkpoint_restored"]
    for e in events:  # gen 2 counts from 1 again
        if e.get("gen") == 2 and isinstance(e.get("step"), int):
            e["step"] -= 50
    report = account(events, running=False)
    assert report.generations[1].buckets["recomputed"] == pytest.approx(57.0)
    assert report.generations[1].productive_s == pytest.approx(0.0)


def test_checkpoint_stalls_come_out_of_training() -> None:
    events = [
        started(0.0),
        launched(1, 0.0),
        *steps(1, 1.0, 1, 51, stall_s=0.0),
        ev("progress", 51.5, gen=1, step=51, stall_s=3.0),
        ev("generation_ended", 52.0, gen=1, outcome="succeeded", step=51),
        ev("job_finished", 52.0),
    ]
    job = account(events, running=False).job
    assert job.buckets["checkpoint_stall"] == pytest.approx(3.0)
    assert job.productive_s == pytest.approx(51.0 - 3.0)
    assert_adds_up(job)


def test_a_shrunken_data_parallel_job_loses_in_proportion_to_its_ranks() -> None:
    events = [
        started(0.0, hosts=2, nproc=2),
        launched(1, 0.0, world=2),  # 2 of the 4 ranks it was launched with
        *steps(1, 1.0, 1, 41),
        ev("generation_ended", 41.0, gen=1, outcome="succeeded", step=41),
        ev("job_finished", 41.0),
    ]
    job = account(events, running=False).job
    assert job.buckets["smaller_plan"] == pytest.approx(20.0)
    assert job.productive_s == pytest.approx(20.0)


def test_a_planned_job_compares_its_plan_with_the_best_on_all_hosts() -> None:
    events = [
        started(0.0),
        ev("plan_chosen", 0.0, gen=1, summary="PP2", predicted_step_s=1.25, full_step_s=1.0),
        launched(1, 0.0),
        *steps(1, 1.0, 1, 41),
        ev("generation_ended", 41.0, gen=1, outcome="succeeded", step=41),
        ev("job_finished", 41.0),
    ]
    job = account(events, running=False).job
    assert job.buckets["smaller_plan"] == pytest.approx(8.0)  # 40 s at 0.8 of the best speed
    assert job.productive_s == pytest.approx(32.0)


def a_grow(persist_wait_s: float = 0.0) -> list[dict[str, Any]]:
    """Generation 1 steps 1-21 and grows (first waiting `persist_wait_s` for a persist, if any):
    1 s to end it, 1 s until the next launch, generation 2 steps 22-32 from 2 s after it."""
    w = persist_wait_s
    persist = [
        ev("persist_requested", 21.0, gen=1, why="grow", step=21),
        ev("persist_committed", 21.0 + w, gen=1, step=21),
    ]
    return [
        started(0.0),
        launched(1, 0.0),
        *steps(1, 1.0, 1, 21),
        *(persist if w else []),
        ev("reconfigure", 21.0 + w, gen=1, why="grow", step=21),
        ev("generation_ended", 22.0 + w, gen=1, outcome="reconfigured", step=21),
        launched(2, 23.0 + w),
        *steps(2, 25.0 + w, 22, 32),
        ev("generation_ended", 35.0 + w, gen=2, outcome="succeeded", step=32),
        ev("job_finished", 35.0 + w),
    ]


def test_a_planned_grow_is_a_teardown_and_a_relaunch_without_detection() -> None:
    report = account(a_grow(), running=False)
    g1 = report.generations[1]
    assert g1.buckets["teardown"] == pytest.approx(1.0)
    assert g1.buckets["waiting_for_hosts"] == pytest.approx(1.0)
    assert g1.buckets["detection"] == 0.0
    assert g1.buckets["recomputed"] == 0.0  # it restarted at 22: nothing done twice
    assert report.generations[2].buckets["relaunch"] == pytest.approx(2.0)
    assert_adds_up(report.job)


def test_a_grows_wait_for_its_persist_is_part_of_its_teardown() -> None:
    report = account(a_grow(persist_wait_s=2.5), running=False)
    assert report.generations[1].buckets["teardown"] == pytest.approx(1.0 + 2.5)
    assert report.generations[1].productive_s == pytest.approx(20.0)  # steps 1-21
    assert_adds_up(report.job)


def test_a_running_job_is_counted_up_to_now_and_a_dead_one_to_its_last_event() -> None:
    events = [started(0.0), launched(1, 1.0), *steps(1, 2.0, 1, 11)]
    running = account(events, running=True, now=20.0)
    assert running.job.wall_s == pytest.approx(20.0)
    assert running.job.productive_s == pytest.approx(18.0)
    dead = account(events, running=False, now=20.0)
    assert dead.job.wall_s == pytest.approx(12.0)  # the last progress, at step 11


def test_the_time_between_runs_of_a_requeued_job_is_not_its_wall_time() -> None:
    events = [
        started(0.0),
        launched(1, 0.0),
        *steps(1, 1.0, 1, 11),
        ev("generation_ended", 11.0, gen=1, outcome="preempted", step=11),
        ev("job_finished", 11.0, state="failed"),
        started(500.0, run=2),
        launched(2, 502.0),
        ev("checkpoint_restored", 503.0, gen=2, step=11, tier="storage", restore_s=1.0),
        *steps(2, 504.0, 12, 22),
        ev("generation_ended", 514.0, gen=2, outcome="succeeded", step=22),
        ev("job_finished", 514.0),
    ]
    report = account(events, running=False)
    assert report.job.wall_s == pytest.approx(11.0 + 14.0)
    g2 = report.generations[2]
    assert g2.buckets["startup"] == pytest.approx(3.0)  # the second run's start-up
    assert g2.buckets["restore"] == pytest.approx(1.0)
    assert report.generations[1].buckets["recomputed"] == 0.0
    assert_adds_up(report.job)


def test_a_job_that_never_launched_is_all_start_up() -> None:
    events = [started(0.0), ev("job_finished", 4.0, state="failed")]
    report = account(events, running=False)
    assert report.job.wall_s == pytest.approx(4.0)
    assert report.job.buckets["startup"] == pytest.approx(4.0)
    assert report.job.ratio == 0.0
    assert account([], running=False).job.ratio is None


def test_every_account_adds_up_whatever_the_journal_order() -> None:
    events = crash_and_restart()
    shuffled = events[:5] + events[5:][::-1]  # out of order: still one bucket per second
    report = account(shuffled, running=False)
    assert set(report.job.buckets) == set(BUCKETS)
    assert_adds_up(report.job)


def test_job_goodput_reads_a_folded_view() -> None:
    view = fold(Path("/nonexistent/job"), crash_and_restart())
    assert view.state == "succeeded"
    report = job_goodput(view)
    assert report.job.productive_s == pytest.approx(98.0)
    assert report.to_json()["goodput"] == pytest.approx(98.0 / 114.0, abs=1e-4)
    assert set(report.to_json()["generations"]) == {"1", "2"}
