"""Stragglers: each rank's pace as its agent measures it (agent/pace.py, on real processes) and
the controller's comparison of hosts (controller/pace.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from ftrun.agent.pace import WINDOW_STEPS, Pace, PaceMeter, sched_ns, thread_state
from ftrun.controller.pace import (
    EVIDENCE,
    JOURNAL_EVERY,
    MIN_ROUNDS,
    RATIO,
    ROUNDS,
    PaceBoard,
    StragglerWatch,
)
from ftrun.jobview.fold import JobFolder
from ftrun.journal import Journal
from ftrun.journal.read import read_journal
from ftrun.sim.quiet import Quiet
from tests.conftest import wait_for


def test_a_sleeping_rank_waits_and_a_spinning_or_stopped_one_does_not() -> None:
    """Real processes, read as the agent reads them (the simulated ranks of test_pace_steps.py
    check the arithmetic)."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        wait_for(lambda: thread_state(sleeper.pid) == "S", 10, "the sleeper asleep")
        wait_for(lambda: thread_state(spinner.pid) in ("R",), 10, "the spinner running")
        assert sched_ns(sleeper.pid) is not None  # schedstat: what follows is counted
        meter = PaceMeter(window_min_s=0.3)
        meter.on_start(0, sleeper.pid)
        meter.on_start(1, spinner.pid)
        step = 0

        def window() -> tuple[Pace, Pace]:
            """Steps every 25 ms, a look at each, until both ranks have a window."""
            nonlocal step
            got: dict[int, Pace] = {}
            deadline = time.monotonic() + 10
            while len(got) < 2 and time.monotonic() < deadline:
                step += 1
                time.sleep(0.025)
                now = time.monotonic()
                for rank in (0, 1):
                    if (pace := meter.on_step(rank, step, now)) is not None:
                        got[rank] = pace
                got.update(meter.sample(now))
            return got[0], got[1]

        meter.on_step(0, 0, time.monotonic())
        meter.on_step(1, 0, time.monotonic())
        asleep, busy = window()
        assert asleep.steps >= WINDOW_STEPS and asleep.wall_s >= 0.3
        assert asleep.compute_s < 0.05 * busy.compute_s  # it only waited
        # Running or waiting for a CPU (this machine may be busy): all of it counted.
        assert abs(busy.compute_s * busy.steps / busy.wall_s - 1) < 0.15, busy
        # A held-back (stopped) rank is not waiting for the others either: sampled, as schedstat
        # does not count it.
        spinner.send_signal(19)  # SIGSTOP
        wait_for(lambda: thread_state(spinner.pid) == "T", 10, "the spinner stopped")
        window()  # (the window the stop began in)
        _, held = window()
        assert held.compute_s * held.steps / held.wall_s > 0.9, held
    finally:
        for p in (sleeper, spinner):
            p.kill()
            p.wait()
    assert thread_state(spinner.pid) is None and sched_ns(spinner.pid) is None  # gone


def rounds(board: PaceBoard, figures: dict[str, float], n: int, step0: int = 0) -> list:
    verdicts = []
    for i in range(n):
        for unit, value in figures.items():
            verdicts += board.add(unit, value, step0 + 10 * (i + 1))[1]
    return verdicts


HOSTS = ["node1", "node2", "node3", "node4"]
HEALTHY = {"node1": 0.20, "node2": 0.21, "node3": 0.19, "node4": 0.22}  # median 0.205


def slowed(ratio: float) -> dict[str, float]:
    """node3 at `ratio` x the median of all four (the others' median: 0.215)."""
    return {**HEALTHY, "node3": round(0.215 * ratio, 6)}


def test_a_host_slower_than_the_others_rounds_in_a_row_is_named_then_recovers() -> None:
    board = PaceBoard(HOSTS)
    assert rounds(board, HEALTHY, 50) == []  # a few percent apart: never
    slow = slowed(2.0)
    assert rounds(board, slow, MIN_ROUNDS - 1) == []  # never on one round
    [named] = rounds(board, slow, 1)
    assert named.unit == "node3" and named.named and named.ratio >= RATIO
    assert named.median_s == 0.215 and named.rounds == MIN_ROUNDS  # the median of all four
    assert rounds(board, slow, 10) == []  # said once
    assert rounds(board, HEALTHY, ROUNDS - 1) == []
    [back] = rounds(board, HEALTHY, 1)
    assert back.unit == "node3" and not back.named


def test_the_slower_the_host_the_fewer_rounds_it_takes_never_one() -> None:
    # (ratio, rounds to be named): the streak's ratios must multiply to RATIO ** 3.
    for ratio, needed in [(RATIO, 3), (1.35, 3), (1.45, 3), (1.5, 2), (2.0, 2), (8.0, 2),
                          (1.29, None)]:  # fmt: skip
        board = PaceBoard(HOSTS)
        got = []
        for n in range(1, 21):
            got += rounds(board, slowed(ratio), 1, step0=10 * n)
            if got:
                break
        assert (got[0].rounds if got else None) == needed, ratio
        assert not got or got[0].ratio == round(0.215 * ratio, 6) / 0.215
    # The streak's evidence adds up: 1.3 x, then 1.7 x (1.3 x 1.7 ≥ 1.3 ** 3) names it.
    board = PaceBoard(HOSTS)
    assert rounds(board, slowed(1.3), 1) == []
    [named] = rounds(board, slowed(1.7), 1)
    assert named.rounds == 2 and EVIDENCE == RATIO**3


def test_noise_names_nobody() -> None:
    board = PaceBoard(HOSTS)
    # A loaded machine slows every rank alike: the median moves with them.
    assert rounds(board, {h: 2.5 * v for h, v in HEALTHY.items()}, 20) == []
    # One outlier round, however far out, between rounds at the others' pace.
    for _ in range(10):
        assert rounds(board, slowed(5.0), 1) + rounds(board, HEALTHY, 1) == []
    # Rounds just over RATIO, each streak ended by one under it: 1.4 x 1.4 < 1.3 ** 3.
    for _ in range(10):
        assert rounds(board, slowed(1.4), 2) + rounds(board, slowed(1.2), 1) == []
    # Every host in turn a round slow: nobody's streak grows.
    for _ in range(5):
        for host in HOSTS:
            assert rounds(board, {**HEALTHY, host: 0.6}, 1) == []
    assert not board.named


def test_quiet_rounds_are_journaled_one_in_five_and_a_streaks_every_round() -> None:
    board = PaceBoard(HOSTS)
    journaled = [bool(board.add(h, v, 10)[0]) for _ in range(10) for h, v in HEALTHY.items()]
    assert journaled.count(True) == 10 // JOURNAL_EVERY
    slow = slowed(1.35)
    assert [bool(board.add(h, v, 10)[0]) for h, v in slow.items()][-1]
    assert [bool(board.add(h, v, 10)[0]) for h, v in slow.items()][-1]


def test_with_two_hosts_each_is_measured_against_the_other(tmp_path: Path) -> None:
    board = PaceBoard(["a", "b"])
    [named] = rounds(board, {"a": 0.1, "b": 0.14}, 3)  # 1.4x the other: 3 rounds
    assert named.unit == "b" and named.rounds == 3
    assert rounds(PaceBoard(["a", "b"]), {"a": 0.1, "b": 0.125}, 20) == []  # 1.25x: no
    journal = Journal(tmp_path / "job", clock=lambda: 1.8e9)
    watch = StragglerWatch(3, {"a#0": "a", "b#0": "b"}, nproc_per_node=2, journal=journal,
                           reporter=Quiet())  # fmt: skip
    for i in range(MIN_ROUNDS):
        watch.on_pace("a#0", {0: (10 * i, 0.1), 1: (10 * i, 0.12)})
        watch.on_pace("b#0", {2: (10 * i, 0.3), 3: (10 * i, 0.31)})
    journal.close()
    events = read_journal(tmp_path / "job").events
    [straggler] = [e for e in events if e["kind"] == "straggler"]
    assert straggler["unit"] == "b" and straggler["ratio"] == round(0.305 / 0.11, 2)
    assert straggler["rounds"] == MIN_ROUNDS  # 2.8x: two rounds are evidence enough
    paces = [e for e in events if e["kind"] == "pace"]
    assert len(paces) == MIN_ROUNDS and paces[0]["compute_s"] == {"a": 0.11, "b": 0.305}


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
