"""The report's attack on --metrics-port (issue 34, item 2), by another user for real (`nobody`):
1,000 connections that never finish their request, and scrapes as fast as they come, against a
running job. The controller's process holds fewer than 100 descriptors more than before, the
metrics still answer, no heartbeat comes near the host-lost timeout, and the job finishes as if
nothing happened."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from tests.conftest import BIN, Output, wait_for
from tests.hostile.otheruser import AS_OTHER, need_root

SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import metrics_attacks  # noqa: E402

ATTACK_S = 12.0


def as_nobody(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*AS_OTHER, sys.executable, str(SCRIPTS / "metrics_attacks.py"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_idle_connections_and_a_scrape_flood_cost_the_job_nothing(ftrun, tmp_path) -> None:
    need_root()
    # 600 steps (30 s) bound the job on a slow day; the stop file ends it once the attacks are
    # over and the metrics answered after them.
    stop = tmp_path / "stop"
    proc = ftrun.start(
        "launch", "--metrics-port", "0", str(BIN / "plain_loop.py"),
        "--steps", "600", "--interval", "0.05", "--stop-file", str(stop),
    )  # fmt: skip
    out = Output(proc)
    attackers: list[subprocess.Popen[str]] = []
    try:
        port = int(
            wait_for(lambda: _port(out.text()), 60, "the metrics port").split(":")[-1].strip("/")
        )
        wait_for(lambda: b"ftrun_step " in _scrape(port), 60, "a step in the metrics")
        controller = psutil.Process(proc.pid)
        fds_before = controller.num_fds()
        began = time.time()
        attackers = [
            as_nobody("slowloris", str(port), "1000", str(ATTACK_S)),
            as_nobody("scrapes", str(port), "3000", "4"),
        ]
        peak = [fds_before]
        watching = threading.Event()

        def watch() -> None:
            while not watching.wait(0.1):
                peak[0] = max(peak[0], controller.num_fds())

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            results = [json.loads(a.communicate(timeout=ATTACK_S + 120)[0]) for a in attackers]
        finally:
            watching.set()
            watcher.join(timeout=5)
        ended = time.time()
        loris, flood = results
        assert loris["opened"] >= 1000, loris
        assert peak[0] - fds_before < 100, (fds_before, peak[0])
        assert flood["ok"] >= 0.9 * 3000, flood  # evicted ones aside, the scrapes get through
        assert b"ftrun_step " in _scrape(port)
        stop.write_text("")
        assert proc.wait(timeout=120) == 0, out.text()
    finally:
        for a in attackers:
            if a.poll() is None:
                a.kill()
                a.wait(timeout=10)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    job_dir = next(ftrun.run_dir.iterdir())
    events = [json.loads(line) for line in (job_dir / "events.jsonl").read_text().splitlines()]
    assert events[-1]["kind"] == "job_finished" and events[-1]["state"] == "succeeded"
    assert not [e for e in events if e["kind"] == "fault_detected"]
    under = [
        e["heartbeat_late"]["max_ms"]
        for e in events
        if e["kind"] == "heartbeat_stats" and began <= e["t"] <= ended + 10
    ]
    assert under and max(under) < 500, under  # host-lost is 1,000 ms on ssh hosts


def _port(text: str) -> str | None:
    for line in text.splitlines():
        if "metrics for Prometheus: http://" in line:
            return line.split("http://", 1)[1].split()[0]
    return None


def _scrape(port: int) -> bytes:
    try:
        return metrics_attacks.scrape(port)
    except OSError:
        return b""
