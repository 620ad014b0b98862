"""`ftrun status --watch` rendering, the Prometheus figures and the notes on long waits, from
journals with known contents (no process started)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry
from rich.console import Console

from ftrun.cli.metrics import JobCollector
from ftrun.cli.watch import JobCache, snapshot, step_rate
from ftrun.controller.generation import GenWatch
from ftrun.controller.patience import Patience
from ftrun.jobview import fold, load_job
from ftrun.wire.inbound import Log, RankStarted
from tests.unit.test_goodput import crash_and_restart, launched, started, steps


def write_job(run_dir: Path, name: str, events: list[dict[str, Any]]) -> Path:
    job = run_dir / name
    job.mkdir(parents=True)
    (job / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return job


def render(renderable: Any, width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, force_terminal=False).print(renderable)
    return out.getvalue()


def running_job(now: float) -> list[dict[str, Any]]:
    # 2 steps a second for the last 20 s; pid 0 is no live controller, so give the view a state.
    return [started(now - 30.0), launched(1, now - 29.0), *steps(1, now - 20.0, 1, 41, dt=0.5)]


def test_step_rate_is_over_the_last_seconds_of_the_current_generation() -> None:
    view = fold(Path("/x/j"), running_job(1000.0))
    view.state = "running"
    assert step_rate(view, 1000.0) == pytest.approx(2.0)
    view.state = "succeeded"
    assert step_rate(view, 1000.0) is None  # a finished job has no rate


@pytest.mark.parametrize("width", [60, 120])
def test_every_figure_shows_at_any_width(tmp_path: Path, width: int) -> None:
    write_job(tmp_path, "job-with-a-long-name-20261123", crash_and_restart())
    text = render(snapshot(tmp_path, None, JobCache(), width), width)
    assert max(len(line) for line in text.splitlines()) <= width
    for needle in ("job-with-a-long-name-20261123", "succeeded", "#1 crash", "86.0%", "100"):
        assert needle in text, needle
    assert ("GOODPUT" in text) == (width >= 100)  # a table when it fits, else blocks


def test_snapshot_reads_the_run_dir_and_rereads_only_changed_journals(tmp_path: Path) -> None:
    job = write_job(tmp_path, "done-1", crash_and_restart())
    cache = JobCache()
    first = cache.view(job)
    assert cache.view(job) is first  # unchanged, finished: not read again
    with (job / "events.jsonl").open("a") as f:
        f.write(json.dumps({"kind": "refusals", "t": 114.5}) + "\n")
    assert cache.view(job) is not first
    text = render(snapshot(tmp_path, None, cache), 120)
    assert "done-1" in text and "Ctrl-C" in text
    assert "no jobs" in render(snapshot(tmp_path / "empty", None, JobCache()), 120)


def test_metrics_are_the_journals_figures(tmp_path: Path) -> None:
    job = write_job(tmp_path, "j-1", crash_and_restart())
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobCollector(load_job(job)))
    families = {
        f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())
    }

    def value(name: str, **labels: str) -> float:
        return next(
            s.value for s in families[name].samples
            if all(s.labels.get(k) == v for k, v in labels.items())
        )  # fmt: skip

    assert value("ftrun_job_state", state="succeeded") == 1.0
    assert value("ftrun_generation") == 2.0 and value("ftrun_step") == 100.0
    assert value("ftrun_incidents", kind="crash", tier="restart-in-place") == 1.0
    assert value("ftrun_goodput_ratio") == pytest.approx(98.0 / 114.0)
    assert value("ftrun_badput_seconds", bucket="restore") == pytest.approx(0.5)
    assert value("ftrun_last_detection_seconds") == pytest.approx(0.2)
    empty = CollectorRegistry(auto_describe=False)
    empty.register(JobCollector())
    assert generate_latest(empty) == b""  # before the job has a view: nothing, no error
    empty.register(JobCollector(load_job(tmp_path / "not-yet")))
    assert generate_latest(empty) == b""  # nor before it has a journal


def test_patience_notes_a_long_wait_at_doubling_intervals() -> None:
    said: list[str] = []

    class Notes:
        def notice(self, text: str, *, level: str = "info") -> None:
            said.append(text)

    now = [0.0]
    patience = Patience(Notes(), first_s=5.0, clock=lambda: now[0])  # type: ignore[arg-type]
    for t in (1.0, 4.9, 5.0, 6.0, 9.9, 10.0, 19.0, 20.5):
        now[0] = t
        patience.note(lambda s: f"waited {s:.1f}")
    assert said == ["waited 5.0", "waited 10.0", "waited 20.5"]
    assert patience.due() == 40.0


def test_ranks_that_print_but_report_no_step_are_told_how_once() -> None:
    """A script written for torchrun trains without ever reporting a step: after the first note
    it hears how to give ftrun steps, once, not "still starting" at every later note."""

    class Sink:
        def append_log(self, *args: Any) -> None: ...
        def rank_output(self, *args: Any) -> None: ...
        def record(self, *args: Any, **kwargs: Any) -> None: ...

    sink = Sink()
    watch = GenWatch(1, {"a"}, {"a": "h"}, order=["a"], stall=None, journal=sink, reporter=sink)  # type: ignore[arg-type]
    watch.record_output("h", RankStarted(gen=1, rank=0, pid=1))
    assert "rendezvous, imports or a restore" in (watch.no_step_yet(10.0) or "")
    watch.record_output("h", Log(gen=1, rank=0, lines=["epoch 1 | loss 0.3"]))
    hint = watch.no_step_yet(20.0) or ""
    assert "may not report steps" in hint and "ftrun.step(n)" in hint and "--progress-regex" in hint
    assert watch.no_step_yet(40.0) is None
