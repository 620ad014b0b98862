"""A real 2-rank job that reports no steps: `ftrun status` lists its ranks with their pids, a
rank found there takes `kill -USR1 PID`, and `status`/`inspect` and the pictures give its goodput
as unknown (—), never 0 %; and the page of such a job in headless Chromium."""

from __future__ import annotations

import json
import os
import signal

import psutil
import pytest

from ftrun.cli.timeline_html import render_html
from ftrun.jobview import fold
from ftrun.jobview.goodput import NO_SIGNAL, NO_STEP_YET
from ftrun.jobview.timeline import build_timeline
from tests import browser
from tests.conftest import BIN, Output, wait_for
from tests.integration.test_timeline import load
from tests.unit.test_no_progress_signal import stepless

SIGNALS = str(BIN / "signals.py")  # prints `step N` (no progress signal); USR1: noted, exits 0


def test_ranks_are_listed_found_and_signalled_and_goodput_is_unknown(ftrun, tmp_path):
    proc = ftrun.start(
        "launch", "--nproc-per-node", "2", SIGNALS, "--dir", str(tmp_path), "--after-usr1", "3",
    )  # fmt: skip
    out = Output(proc)
    try:
        out.wait_for("[rank1]: step 2", 60)
        [listed] = ftrun.status_json()
        job_id = listed["job_id"]
        wait_for(lambda: len(ftrun.status_json(job_id)["ranks"]) == 2, 30, "both ranks journaled")
        live = ftrun.status_json(job_id)
        ranks = live["ranks"]
        assert [(r["rank"], r["host"], r["local_rank"], r["state"]) for r in ranks] == [
            (0, "localhost", 0, "running"),
            (1, "localhost", 1, "running"),
        ]
        assert all(psutil.pid_exists(r["pid"]) for r in ranks)
        assert live["goodput"]["goodput"] is None
        assert live["goodput"]["goodput_unknown"] == NO_STEP_YET
        text = ftrun.run("status", job_id).stdout
        assert all(str(r["pid"]) in text for r in ranks) and "kill -USR1 PID" in text
        assert f"goodput —: {NO_STEP_YET}" in text and "0.0%" not in text
        # As docs/ranks.md says: the pid from `status`, then kill. Rank 1's handler, and only
        # its, notes the signal: the pid is that rank's own process.
        os.kill(ranks[1]["pid"], signal.SIGUSR1)
        wait_for((tmp_path / "usr1-rank1").exists, 30, "rank 1 to note SIGUSR1")
        assert not (tmp_path / "usr1-rank0").exists()
        os.kill(ranks[0]["pid"], signal.SIGUSR1)
        assert proc.wait(timeout=60) == 0, "".join(out.lines)[-2000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert (tmp_path / "usr1-rank0").exists()
    done = ftrun.status_json(job_id)
    assert done["state"] == "succeeded"
    assert [(r["state"], r["exit_code"]) for r in done["ranks"]] == [("exited", 0)] * 2
    assert [r["pid"] for r in done["ranks"]] == [r["pid"] for r in ranks]
    assert done["goodput"]["goodput"] is None and done["goodput"]["goodput_unknown"] == NO_SIGNAL
    assert done["goodput"]["badput_s"]["startup"] < done["goodput"]["wall_s"] / 2
    assert done["goodput"]["unknown_s"] > 0
    page = tmp_path / "t.html"
    shown = ftrun.run("inspect", job_id, "--html", str(page))
    assert shown.returncode == 0, shown.stderr
    assert f"goodput —: {NO_SIGNAL}" in " ".join(shown.stdout.split())
    assert "%" not in next(line for line in shown.stdout.splitlines() if "goodput" in line)
    text = page.read_text()
    start = text.index('id="timeline-data">') + len('id="timeline-data">')
    data = json.loads(text[start : text.index("</script>", start)])
    assert [g["starting_end"] for g in data["generations"]] == [None]  # drawn running
    assert data["goodput"]["ratio"] is None and data["goodput"]["unknown"] == NO_SIGNAL


chromium = browser.chromium_fixture()


@pytest.mark.timeout(browser.INSTALL_TIMEOUT_S + 60)  # chromium may be installed first
def test_the_page_draws_a_stepless_job_running_with_goodput_unknown(tmp_path, chromium, test_id):
    page = tmp_path / "stepless.html"
    view = fold(tmp_path / "stepless-1", stepless())
    page.write_text(render_html(build_timeline(view, now=view.ended_t or 0.0)))
    dom = load(chromium, page, test_id)
    assert len(dom.all("g", "gen")) == 2 and dom.all("rect", "gen-starting") == []
    assert f"goodput \u2014 ({NO_SIGNAL})" in dom.text and "starting (to its first" not in dom.text
