"""`ftrun inspect JOB --html/--png` of real jobs, the page loaded in headless Chromium as a person
would load it: a job with a fault injected at a step (two generations, one incident), a job
read while it runs, and the same job after its controller was killed."""

from __future__ import annotations

import json
import os
import signal
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from ftrun.jobview import load_job
from ftrun.jobview.timeline import build_timeline
from tests import browser
from tests.conftest import BIN, Output, tagged, wait_for

CKPT_TRAIN = str(BIN / "ckpt_train.py")
SLEEPER = str(BIN / "sleeper.py")
HOSTILE = "</script><script>alert(1)</script>"
RATE, RELAUNCH = (0x1B, 0x5E, 0x9E), (0x2A, 0x9D, 0x8F)  # their colours in both renderers
chromium = browser.chromium_fixture()


class Dom(HTMLParser):
    """The elements of a dumped DOM (tag, attributes, in order) and the text of a few ids."""

    def __init__(
        self, html: str, text_of: tuple[str, ...] = ("probe", "title", "timeline-error")
    ) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.texts: dict[str, str] = dict.fromkeys(text_of, "")
        self.text = ""  # all the text but the scripts'
        self._open: list[str | None] = []  # for each open element: the id whose text it is in
        self._script = False
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.elements.append((tag, a))
        self._script = tag == "script"
        inside = a.get("id") if a.get("id") in self.texts else (self._open or [None])[-1]
        if tag not in ("meta", "br", "img", "input", "link"):
            self._open.append(inside)

    def handle_endtag(self, tag: str) -> None:
        self._script = False
        if self._open:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        if not self._script:
            self.text += data
        if self._open and self._open[-1] is not None:
            self.texts[self._open[-1]] += data

    def all(self, tag: str, cls: str) -> list[dict[str, str]]:
        return [a for t, a in self.elements if t == tag and cls in a.get("class", "").split()]

    def by_id(self, id_: str) -> dict[str, str] | None:
        return next((a for _, a in self.elements if a.get("id") == id_), None)


def load(chromium: str, page: Path, test_id: str) -> Dom:
    html = browser.dump_dom(
        chromium, page.as_uri() + "#probe", timeout_s=60, env={"FTRUN_TEST_ID": test_id}
    )
    dom = Dom(html)
    assert dom.by_id("timeline-error") is None, f"the script failed: {dom.texts['timeline-error']}"
    assert dom.by_id("timeline")["data-rendered"] == "ok"
    return dom


@pytest.mark.timeout(browser.INSTALL_TIMEOUT_S + 180)  # chromium may be installed first
def test_timeline_of_a_job_with_an_incident(ftrun, tmp_path, chromium, test_id):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    result = ftrun.run(
        "launch",
        "--job-name",
        HOSTILE,
        "--nproc-per-node",
        "2",
        CKPT_TRAIN,
        "--steps",
        "30",
        "--step-time",
        "0.2",
        "--save-every",
        "2",
        "--fail-at",
        "10",
        "--fail-once",
        str(tmp_path / "once"),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    job = ftrun.only_job()
    page, png = tmp_path / "t.html", tmp_path / "t.png"
    shown = ftrun.run("inspect", job["job_id"], "--html", str(page), "--png", str(png))
    assert shown.returncode == 0, shown.stderr
    assert f"timeline page written to {page}" in shown.stdout
    assert f"timeline image written to {png}" in shown.stdout
    assert "incident 1: crash" in shown.stdout  # the usual output is there too
    expected = build_timeline(load_job(ftrun.run_dir / job["job_id"]), now=time.time())
    assert len(expected.generations) == 2 and len(expected.incidents) == 1

    dom = load(chromium, page, test_id)
    assert [g["data-gen"] for g in dom.all("g", "gen")] == ["1", "2"]
    [incident] = dom.all("g", "incident")
    assert incident["data-incident"] == "1"
    drawn = [p["data-phase"] for p in dom.all("rect", "phase")]
    assert drawn == [s.phase for s in expected.incidents[0].segments]
    assert {"detection", "teardown", "relaunch", "restore"} <= set(drawn)
    assert len(dom.all("polyline", "rate-line")) == 2
    points = sum(len(g.points) for g in expected.generations)
    assert points >= 4 and len(dom.all("circle", "rate-point")) == points
    commits = dom.all("line", "commit")
    assert len(commits) == len(expected.commits) >= 4
    assert [c["data-step"] for c in commits] == [str(c.step) for c in expected.commits]
    # the hostile job name is text on the page, and no script but the page's own came to be
    assert HOSTILE in dom.texts["title"]
    assert len([t for t, _ in dom.elements if t == "script"]) == 2
    # hovering shows each element's details
    probe = dom.texts["probe"]
    assert ".phase => incident 1: crash (generation 1)" in probe
    assert ".gen => generation 1 (failed) | hosts: localhost" in probe
    assert (
        ".rate-point => generation 1: " in probe and ".commit-hit => checkpoint committed" in probe
    )

    # the pictures: of the size asked, many colours, the plot areas drawn on (below the legend)
    shot = browser.screenshot(
        chromium, page.as_uri(), tmp_path / "shot.png", env={"FTRUN_TEST_ID": test_id}
    )
    shot_pixels = imread(str(shot))
    assert_has_content(shot_pixels, (1400, 700))
    assert near(shot_pixels[350:620, 150:], RATE) > 100, "no rate line on the page's chart"
    image = imread(str(png))
    assert_has_content(image, (1400, 700))
    assert near(image[175:350, 150:], RELAUNCH) > 50, "no incident band in the image's lanes"
    assert near(image[370:640, 150:], RATE) > 100, "no rate line in the image's plot area"


@pytest.mark.timeout(browser.INSTALL_TIMEOUT_S + 180)
def test_timeline_while_running_and_after_the_controller_died(ftrun, tmp_path, chromium, test_id):
    proc = ftrun.start(
        "launch", "--controller-grace", "0", "--nproc-per-node", "2", SLEEPER, "--interval", "0.1"
    )
    out = Output(proc)
    try:
        out.wait_for("[rank0]: step 3")
        [listed] = ftrun.status_json()
        events = lambda: ftrun.events(listed["job_id"])  # noqa: E731
        # progress is journaled every second: wait for two, so there is a rate to draw
        wait_for(lambda: sum(e["kind"] == "progress" for e in events()) >= 2, 30, "progress")
        page = tmp_path / "live.html"
        assert ftrun.run("inspect", listed["job_id"], "--html", str(page)).returncode == 0
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # the controller dies; its agent fences itself
        proc.wait(timeout=10)
    data = page_data(page)
    assert data["state"] == "running" and data["live"] and data["generations"][0]["open"]
    dom = load(chromium, page, test_id)
    assert [g["data-open"] for g in dom.all("g", "gen")] == ["true"]  # drawn as still running
    assert len(dom.all("circle", "rate-point")) >= 1
    assert dom.all("g", "incident") == [] and "no incidents" in dom.text

    wait_for(lambda: not tagged(test_id), 10, "the fenced agent and its ranks to exit")
    crashed = tmp_path / "crashed.html"
    assert ftrun.run("inspect", listed["job_id"], "--html", str(crashed)).returncode == 0
    data = page_data(crashed)
    assert data["state"] == "failed" and not data["live"]
    assert not data["generations"][0]["open"] and "controller died" in data["reason"]
    dom = load(chromium, crashed, test_id)
    assert [g["data-open"] for g in dom.all("g", "gen")] == ["false"]


def page_data(page: Path) -> dict:
    text = page.read_text()
    start = text.index('id="timeline-data">') + len('id="timeline-data">')
    return json.loads(text[start : text.index("</script>", start)])


def near(pixels, rgb: tuple[int, int, int], tolerance: float = 0.06) -> int:
    """How many pixels are within `tolerance` of the colour `rgb` (0-255)."""
    import numpy as np

    target = np.array(rgb) / 255.0
    return int((np.abs(pixels[..., :3] - target) < tolerance).all(axis=-1).sum())


def assert_has_content(image, size: tuple[int, int]) -> None:
    import numpy as np

    height, width = image.shape[:2]
    assert (width, height) == size
    rgb = (image[..., :3] * 255).astype(np.uint8).reshape(-1, 3)
    colours = np.unique(rgb, axis=0)
    assert len(colours) > 100, f"only {len(colours)} colours: a blank or broken picture"
    inked = (rgb < 235).any(axis=1).mean()
    assert 0.03 < inked < 0.6, f"{inked:.1%} of the picture is drawn on"
