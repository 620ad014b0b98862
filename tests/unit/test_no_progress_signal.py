"""A job whose script reports no steps (no `ftrun.step()`, no `--progress-regex` match): its
goodput is unknown, not 0 %, in every place that shows it, and its generations are drawn as
running, not as starting."""

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

from ftrun.cli.goodput_render import goodput_table
from ftrun.cli.metrics import JobCollector
from ftrun.cli.timeline_html import render_html
from ftrun.cli.watch import JobCache, snapshot
from ftrun.jobview import fold, load_job
from ftrun.jobview.goodput import NO_SIGNAL, NO_STEP_YET, account
from ftrun.jobview.timeline import build_timeline
from tests.unit.test_goodput import crash_and_restart, ev, fault, launched, started


def stepless() -> list[dict[str, Any]]:
    """Gen 1 launched at 2 s, runs without a step, rank 1 dies at 40 (detected 40.5, torn down
    41); gen 2 launched at 43 restores (1 s, reported by the ranks) and runs to 100."""
    return [
        started(0.0),
        launched(1, 2.0),
        *fault(1, 40.0, 40.5, None),  # type: ignore[arg-type]
        ev("torn_down", 41.0, incident=1, gen=1),
        ev("generation_ended", 41.0, gen=1, outcome="failed"),
        ev("restart", 41.5, incident=1),
        launched(2, 43.0),
        ev("checkpoint_restored", 44.0, gen=2, step=None, tier="storage", restore_s=1.0),
        ev("generation_ended", 100.0, gen=2, outcome="succeeded"),
        ev("job_finished", 100.5, state="succeeded"),
    ]


def test_without_steps_goodput_is_unknown_and_the_rest_still_adds_up() -> None:
    report = account(stepless(), running=False)
    job = report.job
    assert job.ratio is None and job.unknown == NO_SIGNAL
    assert job.wall_s == pytest.approx(100.5)
    # Timed by the journal, still badput: before the launch, detection, teardown, the wait.
    assert job.buckets["startup"] == pytest.approx(2.0)
    assert job.buckets["detection"] == pytest.approx(0.5)
    assert job.buckets["waiting_for_hosts"] == pytest.approx(2.0)
    assert job.buckets["restore"] == pytest.approx(1.0)
    assert job.buckets["relaunch"] == 0.0  # not "relaunch 52 %": nothing says it was one
    # What ran (38 s of gen 1, 57 - 1 s of gen 2) is neither training nor start-up for sure.
    assert job.unknown_s == pytest.approx(38.0 + 56.0)
    assert job.unknown_s + sum(job.buckets.values()) == pytest.approx(job.wall_s)
    assert all(g.ratio is None for g in report.generations.values())
    out = report.to_json()
    assert out["goodput"] is None and out["productive_s"] is None
    assert out["goodput_unknown"] == NO_SIGNAL and out["generations"]["2"]["goodput"] is None


def test_a_running_job_without_a_step_yet_says_so_and_one_with_steps_is_unchanged() -> None:
    events = [started(0.0), launched(1, 1.0)]
    assert account(events, running=True, now=30.0).job.unknown == NO_STEP_YET
    with_steps = account(crash_and_restart(), running=False)
    assert with_steps.job.unknown is None and with_steps.job.unknown_s == 0.0
    assert with_steps.job.ratio == pytest.approx(98.0 / 114.0)
    never_launched = account([started(0.0), ev("job_finished", 4.0)], running=False)
    assert never_launched.job.ratio == 0.0  # nothing ran: all start-up, known


def render(renderable: Any, width: int = 120) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, force_terminal=False).print(renderable)
    return out.getvalue()


def test_the_goodput_table_shows_a_dash_and_what_ran() -> None:
    text = render(goodput_table(account(stepless(), running=False)))
    goodput_row = next(line for line in text.splitlines() if line.startswith("goodput"))
    assert "—" in goodput_row and "%" not in goodput_row
    assert "ran, no steps      94.00 s" in text
    assert "relaunch" not in text


def write_job(run_dir: Path, name: str, events: list[dict[str, Any]]) -> Path:
    job = run_dir / name
    job.mkdir(parents=True)
    (job / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return job


@pytest.mark.parametrize("width", [70, 140])
def test_status_watch_shows_a_dash_and_why(tmp_path: Path, width: int) -> None:
    write_job(tmp_path, "stepless-1", stepless())
    write_job(tmp_path, "stepping-1", crash_and_restart())
    text = render(snapshot(tmp_path, None, JobCache(), width), width)
    assert "0.0%" not in text and "86.0%" in text
    assert f"goodput —: {NO_SIGNAL}" in " ".join(text.split())  # wrapped at narrow widths


def test_metrics_leave_out_an_unknown_goodput(tmp_path: Path) -> None:
    def figures(events: list[dict[str, Any]], name: str) -> dict[str, list]:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(JobCollector(load_job(write_job(tmp_path, name, events))))
        text = generate_latest(registry).decode()
        return {f.name: f.samples for f in text_string_to_metric_families(text)}

    unknown = figures(stepless(), "a")
    assert unknown["ftrun_goodput_ratio"] == []  # no sample: Prometheus's "unknown"
    assert [s.value for s in unknown["ftrun_goodput_known"]] == [0.0]
    assert [s.value for s in unknown["ftrun_unknown_seconds"]] == [pytest.approx(94.0)]
    known = figures(crash_and_restart(), "b")
    assert [s.value for s in known["ftrun_goodput_known"]] == [1.0]
    assert [s.value for s in known["ftrun_goodput_ratio"]] == [pytest.approx(98.0 / 114.0)]


def test_the_timeline_draws_stepless_generations_running_with_goodput_unknown() -> None:
    view = fold(Path("/nonexistent/stepless"), stepless())
    tl = build_timeline(view, now=200.0)
    assert [g.starting_end for g in tl.generations] == [None, None]  # no paler "starting" part
    assert [g.goodput for g in tl.generations] == [None, None]
    assert tl.goodput is not None and tl.goodput["ratio"] is None
    assert tl.goodput["unknown"] == NO_SIGNAL and tl.goodput["unknown_s"] == pytest.approx(94.0)
    assert "relaunch" not in dict(tl.goodput["lost"])
    assert '"starting_end": null' in render_html(tl)
    # A job with steps: each generation is starting up to its first step, as before.
    stepping = build_timeline(fold(Path("/nonexistent/s"), crash_and_restart()), now=200.0)
    assert [g.starting_end for g in stepping.generations] == [3.0, 64.0]
    failed_early = [*crash_and_restart()[:-2], launched(3, 114.0), ev("job_finished", 120.0)]
    tl3 = build_timeline(fold(Path("/nonexistent/f"), failed_early), now=200.0)
    assert tl3.generations[-1].starting_end == tl3.generations[-1].end  # starting until its end


def test_the_png_says_goodput_is_unknown(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from ftrun.cli import timeline_png

    tl = build_timeline(fold(Path("/nonexistent/stepless"), stepless()), now=200.0)
    [_, line] = timeline_png._summary(tl)
    assert line.startswith(f"goodput — ({NO_SIGNAL})") and "%" not in line
    assert timeline_png.render_png(tl).startswith(b"\x89PNG")
