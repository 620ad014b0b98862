"""Stragglers: each rank's pace as its agent measures it (agent/pace.py, on real processes) and
the controller's comparison of hosts (controller/pace.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from ftrun.agent.pace import WINDOW_MIN_S, WINDOW_STEPS, PaceMeter, thread_state
from ftrun.controller.pace import RATIO, ROUNDS, PaceBoard, StragglerWatch
from ftrun.jobview.fold import JobFolder
from ftrun.journal import Journal
from ftrun.journal.read import read_journal
from ftrun.sim.quiet import Quiet
from tests.conftest import wait_for


def test_a_sleeping_rank_waits_and_a_spinning_or_stopped_one_does_not() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        wait_for(lambda: thread_state(sleeper.pid) == "S", 10, "the sleeper asleep")
        wait_for(lambda: thread_state(spinner.pid) in ("R",), 10, "the spinner running")
        meter = PaceMeter()
        meter.on_start(0, sleeper.pid)
        meter.on_start(1, spinner.pid)
        t0 = time.monotonic()
        meter.on_step(0, 1, t0)
        meter.on_step(1, 1, t0)
        for _ in range(40):
            meter.sample()
            time.sleep(0.01)
        end = t0 + WINDOW_MIN_S
        asleep, busy = (
            meter.on_step(0, 1 + WINDOW_STEPS, end),
            meter.on_step(1, 1 + WINDOW_STEPS, end),
        )
        assert asleep is not None and busy is not None
        assert asleep.compute_s < 0.05 * busy.compute_s  # it only waited
        # A held-back (stopped) rank is not waiting for the others either.
        spinner.send_signal(19)  # SIGSTOP
        wait_for(lambda: thread_state(spinner.pid) == "T", 10, "the spinner stopped")
        for _ in range(20):
            meter.sample()
        held = meter.on_step(1, 1 + 2 * WINDOW_STEPS, end + WINDOW_MIN_S)
        assert held is not None and held.compute_s == busy.compute_s
    finally:
        for p in (sleeper, spinner):
            p.kill()
            p.wait()
    assert thread_state(spinner.pid) is None  # gone: no state, no sample


def test_a_window_with_a_declared_section_or_too_short_is_not_reported() -> None:
    meter = PaceMeter()
    meter.on_start(0, 1)  # pid 1: always there
    meter.on_step(0, 1, 0.0)
    for _ in range(20):
        meter.sample()
    assert meter.on_step(0, 1 + WINDOW_STEPS - 1, WINDOW_MIN_S) is None  # too few steps
    assert meter.on_step(0, 1 + WINDOW_STEPS, 0.5) is None  # too short
    meter.on_section(0, inside=True)  # an evaluation: not every rank's work
    for _ in range(20):
        meter.sample()
    meter.on_section(0, inside=False)
    assert meter.on_step(0, 1 + WINDOW_STEPS, WINDOW_MIN_S) is None
    for _ in range(20):
        meter.sample()
    assert meter.on_step(0, 1 + 2 * WINDOW_STEPS, 2 * WINDOW_MIN_S) is not None


def rounds(board: PaceBoard, figures: dict[str, float], n: int, step0: int = 0) -> list:
    verdicts = []
    for i in range(n):
        for unit, value in figures.items():
            verdicts += board.add(unit, value, step0 + 10 * (i + 1))[1]
    return verdicts


def test_a_host_slower_than_the_others_rounds_in_a_row_is_named_then_recovers() -> None:
    hosts = ["node1", "node2", "node3", "node4"]
    board = PaceBoard(hosts)
    healthy = {"node1": 0.20, "node2": 0.21, "node3": 0.19, "node4": 0.22}
    assert rounds(board, healthy, 50) == []  # a few percent apart: never
    slow = {**healthy, "node3": 0.40}
    assert rounds(board, slow, ROUNDS - 1) == []  # not yet: rounds in a row
    [named] = rounds(board, slow, 1)
    assert named.unit == "node3" and named.named and named.ratio >= RATIO
    assert named.median_s == 0.215  # the median of all four
    assert rounds(board, slow, 10) == []  # said once
    assert rounds(board, healthy, ROUNDS - 1) == []
    [back] = rounds(board, healthy, 1)
    assert back.unit == "node3" and not back.named
    # One slow round between fast ones is noise.
    assert rounds(board, slow, 1) + rounds(board, healthy, 1) + rounds(board, slow, 1) == []


def test_with_two_hosts_each_is_measured_against_the_other(tmp_path: Path) -> None:
    board = PaceBoard(["a", "b"])
    [named] = rounds(board, {"a": 0.1, "b": 0.14}, ROUNDS)  # 1.4x the other
    assert named.unit == "b"
    assert rounds(PaceBoard(["a", "b"]), {"a": 0.1, "b": 0.125}, 20) == []  # 1.25x: no
    journal = Journal(tmp_path / "job", clock=lambda: 1.8e9)
    watch = StragglerWatch(3, {"a#0": "a", "b#0": "b"}, nproc_per_node=2, journal=journal,
                           reporter=Quiet())  # fmt: skip
    for i in range(ROUNDS):
        watch.on_pace("a#0", {0: (10 * i, 0.1), 1: (10 * i, 0.12)})
        watch.on_pace("b#0", {2: (10 * i, 0.3), 3: (10 * i, 0.31)})
    journal.close()
    events = read_journal(tmp_path / "job").events
    [straggler] = [e for e in events if e["kind"] == "straggler"]
    assert straggler["unit"] == "b" and straggler["ratio"] == round(0.305 / 0.11, 2)
    paces = [e for e in events if e["kind"] == "pace"]
    assert len(paces) == ROUNDS and paces[0]["compute_s"] == {"a": 0.11, "b": 0.305}


def test_a_one_host_job_compares_all_its_ranks_whichever_reports_first(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "job", clock=lambda: 1.8e9)
    watch = StragglerWatch(1, {"h#0": "h"}, nproc_per_node=3, journal=journal, reporter=Quiet())
    for i in range(ROUNDS):
        watch.on_pace("h#0", {1: (10 * i, 0.1), 2: (10 * i, 0.3)})  # rank 0's window comes later
        watch.on_pace("h#0", {0: (10 * i, 0.11)})
    journal.close()
    events = read_journal(tmp_path / "job").events
    assert [e["unit"] for e in events if e["kind"] == "straggler"] == ["rank 2"]
    assert set(next(e for e in events if e["kind"] == "pace")["compute_s"]) == {
        "rank 0",
        "rank 1",
        "rank 2",
    }


def test_the_journals_pace_and_stragglers_are_metrics_and_survive_the_summary(
    tmp_path: Path,
) -> None:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.registry import CollectorRegistry

    from ftrun.cli.metrics import JobCollector
    from ftrun.jobview import load_job
    from ftrun.jobview.summary import folder_from_json, folder_to_json
    from tests.unit.test_goodput import crash_and_restart
    from tests.unit.test_watch import write_job

    events = crash_and_restart() + [
        {"kind": "pace", "t": 200.0, "gen": 2, "unit": "host", "step": 90,
         "compute_s": {"node1": 0.1, "node2": 0.31}},
        {"kind": "straggler", "t": 201.0, "gen": 2, "unit": "node2", "compute_s": 0.31,
         "median_s": 0.1, "ratio": 3.1, "step": 90, "rounds": 3},
    ]  # fmt: skip
    job = write_job(tmp_path, "j-1", events)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobCollector(load_job(job)))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(generate_latest(registry).decode())
        for s in f.samples
    }
    assert samples[("ftrun_compute_seconds_per_step", (("unit", "node2"),))] == 0.31
    assert samples[("ftrun_stragglers", (("unit", "node2"),))] == 1.0
    folder = JobFolder()
    for e in events:
        folder.feed(e)
    again = folder_from_json(json.loads(json.dumps(folder_to_json(folder))))
    assert again.pace == folder.pace and again.pace.stragglers[0]["unit"] == "node2"


def test_status_watch_names_the_running_generations_stragglers() -> None:
    from ftrun.cli.watch import hosts_text
    from ftrun.jobview.views import JobView

    view = JobView(job_id="j-1", job_dir=Path("/r/j-1"), generation=2,
                   hosts={"node1": "active", "node2": "active", "node5": "spare"})  # fmt: skip
    assert hosts_text(view) == "2 active 1 spare"
    view.pace.stragglers = [
        {"gen": 1, "unit": "node3", "ratio": 2.0, "recovered_t": None},  # an older generation's
        {"gen": 2, "unit": "node2", "ratio": 1.6, "recovered_t": None},
    ]
    assert hosts_text(view) == "2 active 1 spare; slow: node2 1.6x"
