"""The timeline of `ftrun inspect --html/--png`, from synthetic journals with known timings:
step rates, incident phase pieces, markers, commits, and journal text that tries to escape."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from ftrun.cli.inspect import draw_timeline
from ftrun.cli.timeline_html import embed_json, render_html
from ftrun.errors import EXIT_USAGE, UsageError
from ftrun.jobview import fold
from ftrun.jobview.timeline import PHASES, build_timeline, segments

T0 = 1_800_000_000.0
HOSTILE = "</script><script>alert(1)</script>"
DEAD_PID = 2**22 + 1  # no such process: a job without job_finished reads as crashed


def events(*items: tuple[float, str, dict]) -> list[dict]:
    return [{"t": T0 + t, "kind": kind, **fields} for t, kind, fields in items]


def restarted_job(*, finished: bool = True) -> list[dict]:
    """Two generations on a, b; rank 1 dies at +20 s (step 50), back at step 41 at +24 s."""
    evs = [
        (0.0, "job_started", {"name": "j", "hosts": ["a", "b"], "controller_pid": DEAD_PID}),
        (0.2, "agent_connected", {"host": "a"}),
        (0.2, "agent_connected", {"host": "b"}),
        (0.3, "plan_chosen", {"gen": 1, "summary": "DP2", "why": "all hosts"}),
        (0.5, "generation_launched", {"gen": 1, "hosts": ["a", "b"], "world_size": 4}),
        (2.0, "first_step", {"gen": 1, "step": 1}),
        (4.0, "progress", {"gen": 1, "step": 11}),  # 5 steps/s
        (6.0, "progress", {"gen": 1, "step": 31}),  # 10 steps/s
        (6.5, "checkpoint_committed", {"gen": 1, "step": 30}),
        (10.0, "progress", {"gen": 1, "step": 31}),  # 0 steps/s: a stall
        (10.5, "checkpoint_committed", {"gen": 1, "step": 40}),
        (
            20.5,
            "fault_detected",
            {"incident": 1, "gen": 1, "fault": "crash", "host": "b", "rank": 1, "fault_t": T0 + 20},
        ),
        (20.5, "fault_classified", {"incident": 1, "tier": "restart-in-place", "reason": "r"}),
        (21.0, "torn_down", {"incident": 1, "gen": 1}),
        (21.0, "generation_ended", {"gen": 1, "outcome": "failed", "step": 50}),
        (21.0, "restart", {"incident": 1}),
        (21.1, "plan_chosen", {"gen": 2, "summary": "DP2", "why": "same hosts"}),
        (22.0, "generation_launched", {"gen": 2, "hosts": ["a", "b"], "world_size": 4}),
        (23.0, "checkpoint_restored", {"gen": 2, "step": 40, "tier": "memory", "restore_s": 0.4}),
        (24.0, "first_step", {"gen": 2, "step": 41}),
        (26.0, "progress", {"gen": 2, "step": 45}),  # 2 steps/s
    ]
    if finished:
        evs += [
            (27.0, "generation_ended", {"gen": 2, "outcome": "succeeded", "step": 45}),
            (27.5, "job_finished", {"state": "succeeded", "exit_code": 0, "reason": "done"}),
        ]
    return events(*evs)


def timeline_of(evs: list[dict], tmp_path: Path, *, now: float = T0 + 100):
    return build_timeline(fold(tmp_path / "job-1", evs), now=now)


def test_rates_are_measured_between_consecutive_points_of_a_generation(tmp_path):
    tl = timeline_of(restarted_job(), tmp_path)
    g1, g2 = tl.generations
    assert [(p.t0, p.t1, p.rate) for p in g1.points] == [
        (2.0, 4.0, 5.0),
        (4.0, 6.0, 10.0),
        (6.0, 10.0, 0.0),
    ]
    # never across the restart: generation 2 starts its own line
    assert [(p.step0, p.step1, p.rate) for p in g2.points] == [(41, 45, 2.0)]
    assert tl.max_rate == 10.0
    assert (g1.start, g1.end, g1.outcome, g1.open) == (0.5, 21.0, "failed", False)
    assert g2.restored == {"step": 40, "tier": "memory", "restore_s": 0.4}
    assert (tl.span, tl.state, tl.live) == (27.5, "succeeded", False)


def test_incident_is_cut_into_its_phases(tmp_path):
    [band] = timeline_of(restarted_job(), tmp_path).incidents
    got = [(s.phase, s.start, s.end, s.open) for s in band.segments]
    assert got == [
        ("detection", 20.0, 20.5, False),
        ("teardown", 20.5, 21.0, False),
        ("waiting for hosts", 21.0, 22.0, False),
        # generation 2 reported its 0.4 s restore done at +23 s: cut out of its relaunch
        ("relaunch", 22.0, 22.6, False),
        ("restore", 22.6, 23.0, False),
        ("relaunch", 23.0, 24.0, False),
    ]
    assert set(PHASES) == {s.phase for s in band.segments}
    assert (band.start, band.end, band.host, band.rank, band.tier) == (
        20.0,
        24.0,
        "b",
        1,
        "restart-in-place",
    )


def test_a_running_incident_runs_open_to_now_and_a_missing_point_joins_phases(tmp_path):
    evs = [e for e in restarted_job(finished=False) if e["kind"] != "torn_down"]
    evs = [e for e in evs if not (e["kind"] == "first_step" and e["gen"] == 2)]
    view = fold(tmp_path / "job-1", evs)
    view.state = "running"  # as if its controller still ran
    [inc] = view.incidents
    got = [(s.phase, s.open) for s in segments(inc, end=T0 + 30)]
    assert got == [
        ("detection", False),
        ("teardown + waiting for hosts", False),
        ("relaunch", True),
    ]
    tl = build_timeline(view, now=T0 + 30)
    assert tl.live and tl.span == 30.0 and tl.generations[1].open
    assert tl.incidents[0].segments[-1].end == 30.0


def test_markers_hosts_joining_leaving_and_plan_changes(tmp_path):
    evs = restarted_job() + events(
        (11.0, "host_added", {"host": "c"}),
        (11.5, "agent_connected", {"host": "c"}),  # after the start: a host joining
        (12.0, "host_unreachable", {"host": "d", "error": "no route"}),
        (
            13.0,
            "fault_detected",
            {"incident": 2, "gen": 1, "fault": "host-lost", "host": "a", "detected_t": T0 + 13},
        ),
        (14.0, "host_removed", {"host": "a"}),
        (15.0, "plan_chosen", {"gen": 3, "summary": "DP1", "why": "fewer hosts"}),
    )
    evs.sort(key=lambda e: e["t"])
    tl = timeline_of(evs, tmp_path)
    got = [(m.t, m.kind, m.host) for m in tl.markers]
    # the agents connecting at the start are not joins; an unchanged plan is not a change
    assert got == [
        (11.0, "host_added", "c"),
        (11.5, "host_joined", "c"),
        (12.0, "host_unreachable", "d"),
        (13.0, "host_lost", "a"),
        (14.0, "host_removed", "a"),
        (15.0, "plan_changed", None),
        (21.1, "plan_changed", None),
    ]
    assert tl.markers[5].detail == "DP2 → DP1 (fewer hosts)"


def test_goodput_speaks_of_the_same_seconds(tmp_path):
    tl = timeline_of(restarted_job(), tmp_path)
    assert tl.goodput is not None and 0 < tl.goodput["ratio"] < 1
    lost = dict(tl.goodput["lost"])
    assert lost["detection"] == 0.5 and lost["teardown"] == 0.5 + 0.5  # and the job's end
    assert lost["waiting for hosts"] == 1.0 and lost["restore"] == 0.4
    assert lost["relaunch"] == pytest.approx(2.0 - 0.4)
    assert all(0 < g.goodput <= 1 for g in tl.generations)


def test_both_renderers_colour_every_phase():
    from ftrun.cli import timeline_png

    script = (Path(timeline_png.__file__).parent / "timeline.js").read_text()
    colours = script.split("PHASE_COLOURS = {", 1)[1].split("};", 1)[0]
    for phase in PHASES:
        assert phase in timeline_png.PHASE_COLOURS
        assert f'"{phase}":' in colours or f" {phase}:" in colours, phase


def test_commits_are_ticks(tmp_path):
    tl = timeline_of(restarted_job(), tmp_path)
    assert [(c.t, c.gen, c.step) for c in tl.commits] == [(6.5, 1, 30), (10.5, 1, 40)]
    assert tl.commits_total == 2


def test_a_long_job_is_thinned_and_its_rates_stay_exact(tmp_path):
    steps = [(1.0 + i, "progress", {"gen": 1, "step": 3 * i}) for i in range(5000)]
    evs = events(
        (0.0, "job_started", {"controller_pid": DEAD_PID}),
        (0.5, "generation_launched", {"gen": 1, "hosts": ["a"], "world_size": 1}),
        (1.0, "first_step", {"gen": 1, "step": 0}),
        *steps[1:],
        *[(1.5 + i, "checkpoint_committed", {"gen": 1, "step": 3 * i}) for i in range(4000)],
    )
    tl = timeline_of(evs, tmp_path)
    points = tl.generations[0].points
    assert 700 < len(points) <= 801 and {p.rate for p in points} == {3.0}
    assert points[-1].step1 == 3 * 4999
    assert 1000 < len(tl.commits) <= 1501 and tl.commits_total == 4000
    assert len(json.dumps(tl.to_json())) < 400_000


def test_empty_and_stepless_journals(tmp_path):
    crashed = timeline_of(events((0.0, "job_started", {"controller_pid": DEAD_PID})), tmp_path)
    assert crashed.state == "failed" and crashed.generations == [] and crashed.span > 0
    launched = timeline_of(
        events(
            (0.0, "job_started", {"controller_pid": DEAD_PID}),
            (1.0, "generation_launched", {"gen": 1, "hosts": ["a"], "world_size": 1}),
        ),
        tmp_path,
    )
    # the controller died: the generation ends at the last event, not at `now`
    [g] = launched.generations
    assert (g.points, g.end, g.open, launched.span) == ([], 1.0, False, 1.0)
    assert launched.incidents == [] and launched.markers == [] and launched.commits == []
    for tl in (crashed, launched):
        assert 'data-rendered="no"' in render_html(tl)


def test_hostile_journal_text_cannot_leave_the_data_block(tmp_path):
    evs = restarted_job()
    evs[0]["name"] = HOSTILE
    evs[1]["host"] = HOSTILE
    for ev in evs:
        if ev["kind"] == "fault_detected":
            ev.update(host=HOSTILE, exception=f"{HOSTILE}<!-- & \u2028")
    page = render_html(timeline_of(evs, tmp_path))
    # one script block of data, one of code, and the page's one closing tag for each
    assert page.count("<script") == 2 and page.count("</script>") == 2
    assert "alert(1)</" not in page and "<!--" not in page
    data = re.search(r'<script type="application/json" id="timeline-data">(.*?)</script>', page)
    assert data is not None and "<" not in data.group(1) and ">" not in data.group(1)
    decoded = json.loads(data.group(1))
    assert decoded["name"] == HOSTILE and decoded["incidents"][0]["host"] == HOSTILE
    assert decoded["incidents"][0]["exception"] == f"{HOSTILE}<!-- & \u2028"
    # the title is escaped as HTML, the script sets texts as text only
    assert "<title>ftrun timeline: job-1 (&lt;/script&gt;" in page
    script = page.split("<script>", 1)[1]
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script
    assert "document.write" not in script and "eval(" not in script


def test_embedded_json_means_the_same_and_has_no_nan(tmp_path):
    assert embed_json({"a": "</script>&"}) == '{"a": "\\u003c/script\\u003e\\u0026"}'
    tl = timeline_of(restarted_job(), tmp_path)
    tl.goodput = {"ratio": float("nan"), "lost": [["x", float("inf")]]}
    assert tl.to_json()["goodput"] == {"ratio": None, "lost": [["x", None]]}
    assert json.loads(embed_json(tl.to_json()))["goodput"]["ratio"] is None


def test_png_of_a_hostile_name_is_drawn_as_text(tmp_path):
    pytest.importorskip("matplotlib")
    from ftrun.cli.timeline_png import render_png

    evs = restarted_job()
    evs[0]["name"] = "$\\frac{$ " + HOSTILE  # as mathtext, this raises when drawn
    evs[4]["hosts"] = ["$\\frac{$", "b"]  # generation 1, labelled on its bar
    png = render_png(timeline_of(evs, tmp_path))
    assert png.startswith(b"\x89PNG") and len(png) > 20_000


def test_the_page_allows_no_network_and_only_its_own_script(tmp_path):
    page = render_html(timeline_of(restarted_job(), tmp_path))
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page).group(1)
    assert "default-src 'none'" in csp and "script-src 'sha256-" in csp
    assert "unsafe-inline" not in csp.split("script-src", 1)[1].split(";")[0]
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in page


def test_png_without_matplotlib_is_a_usage_error_with_the_hint(tmp_path, monkeypatch):
    view = fold(tmp_path / "job-1", restarted_job())
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    out = tmp_path / "t.png"
    with pytest.raises(UsageError) as err:
        draw_timeline(view, html_file=tmp_path / "t.html", png_file=out)
    assert err.value.exit_code == EXIT_USAGE and "pip install 'ftrun[plot]'" in err.value.hint
    assert not out.exists() and not (tmp_path / "t.html").exists()  # nothing half written


def test_an_unwritable_file_is_a_usage_error(tmp_path):
    view = fold(tmp_path / "job-1", restarted_job())
    with pytest.raises(UsageError) as err:
        draw_timeline(view, html_file=tmp_path / "no" / "such" / "t.html", png_file=None)
    assert "cannot write --html" in err.value.message and "create" in err.value.hint
    with pytest.raises(UsageError) as err:
        draw_timeline(view, html_file=tmp_path, png_file=None)
    assert "takes a file name" in err.value.hint
    [(what, path)] = draw_timeline(view, html_file=tmp_path / "t.html", png_file=None)
    assert path == (tmp_path / "t.html").resolve() and path.read_text().startswith("<!DOCTYPE")


@pytest.fixture
def job_on_disk(tmp_path: Path) -> tuple[Path, str]:
    """A run dir holding the restarted job's journal, as `ftrun launch` would leave it."""
    job_dir = tmp_path / "runs" / "job-1"
    job_dir.mkdir(parents=True, mode=0o700)
    lines = "".join(json.dumps(ev) + "\n" for ev in restarted_job())
    (job_dir / "events.jsonl").write_text(lines)
    return tmp_path / "runs", "job-1"


def test_cli_writes_both_pictures_beside_the_usual_output(ftrun, job_on_disk, tmp_path):
    pytest.importorskip("matplotlib")
    page, image = tmp_path / "t.html", tmp_path / "t.png"
    out = ftrun.run("inspect", "job-1", "--html", str(page), "--png", str(image))
    assert out.returncode == 0, out.stderr
    assert "incident 1: crash" in out.stdout and "goodput" in out.stdout
    assert f"timeline page written to {page}" in out.stdout
    assert f"timeline image written to {image}" in out.stdout
    assert page.read_text().startswith("<!DOCTYPE html>")
    assert image.read_bytes().startswith(b"\x89PNG")
    as_json = ftrun.run("inspect", "job-1", "--json", "--html", str(page))
    assert json.loads(as_json.stdout)["job_id"] == "job-1"  # stdout stays one JSON document
    assert "timeline page written" in as_json.stderr


def test_cli_without_matplotlib_says_what_to_install(ftrun, job_on_disk, tmp_path):
    shadow = tmp_path / "shadow" / "matplotlib"  # an import of matplotlib fails, as if missing
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'matplotlib'\")\n")
    path = f"{shadow.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    page = tmp_path / "t.html"
    out = ftrun.run(
        "inspect", "job-1", "--html", str(page), "--png", str(tmp_path / "t.png"),
        env={"PYTHONPATH": path},
    )  # fmt: skip
    assert out.returncode == EXIT_USAGE and out.stdout == ""
    assert "--png needs matplotlib" in out.stderr and "pip install 'ftrun[plot]'" in out.stderr
    assert "Traceback" not in out.stderr and not page.exists()
    unwritable = ftrun.run("inspect", "job-1", "--html", str(tmp_path / "no" / "t.html"))
    assert unwritable.returncode == EXIT_USAGE and "cannot write --html" in unwritable.stderr
    assert "Traceback" not in unwritable.stderr
