"""scripts/bench_hostile.py's figures for issue 34 items 2 and 6: what a job pays for its
metrics under attack, and what a listing costs on a long journal.

metrics   a real 2-rank job with --metrics-port; once it steps, 1,000 slowloris connections
          (as `nobody` when run as root) and 10,000 scrapes at once. Rows: the controller's
          descriptors and the heartbeat lateness (the controller's own heartbeat_stats) before
          and under the attack.
listing   a 100 MB journal of a long job (scripts/longjournal.py): `status`, `status JOB`,
          `inspect` (text, --json, --html) as a job older than summaries has them (the journal
          streamed whole) and with the summary the controller keeps (the journal past it).
          Wall time and peak memory of each command.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import benchlib
import longjournal
import psutil
from benchlib import Column, Table

ROOT = Path(__file__).resolve().parent.parent
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _attacker(*args: str) -> subprocess.Popen[str]:
    who = AS_NOBODY if os.geteuid() == 0 and shutil.which("setpriv") else []
    cmd = [*who, sys.executable, str(ROOT / "scripts" / "metrics_attacks.py"), *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)


def lateness(events: list[dict[str, Any]], start: float, end: float) -> tuple[Any, Any, int]:
    stats = [e for e in events if e["kind"] == "heartbeat_stats" and start <= e["t"] <= end]
    if not stats:
        return None, None, 0
    p99 = max(e["heartbeat_late"]["p99_ms"] or 0 for e in stats)
    top = max(e["heartbeat_late"]["max_ms"] or 0 for e in stats)
    return p99, top, sum(e["heartbeat_late"]["n"] for e in stats)


def metrics_rows(root: Path, *, connections: int = 1000, scrapes: int = 10_000) -> list[dict]:
    run_dir = root / "runs"
    cmd = [
        sys.executable, "-m", "ftrun", "launch", "--metrics-port", "0", "--nproc-per-node", "2",
        str(ROOT / "tests" / "bin" / "train_toy.py"), "--steps", "3000", "--step-time", "0.02",
    ]  # fmt: skip
    run = benchlib.Run(cmd, env={"FTRUN_RUN_DIR": str(run_dir), "OMP_NUM_THREADS": "1"})
    try:
        line = run.wait_for(r"metrics for Prometheus: http://\S+", 120)
        if line is None or run.wait_for(r"\[rank0\]: STEP 20 ", 120) is None:
            raise SystemExit("the job did not start: " + run.tail(2000))
        port = int(line.group(0).rsplit(":", 1)[1].strip().strip("/"))
        controller = psutil.Process(run.proc.pid)
        time.sleep(21)  # two heartbeat_stats periods before the attack (10 s each)
        fds_before = controller.num_fds()
        began = time.time()
        flood = [_attacker("slowloris", str(port), str(connections), "40"),
                 _attacker("scrapes", str(port), str(scrapes), "4")]  # fmt: skip
        peak, stop = [fds_before], threading.Event()

        def watch() -> None:
            while not stop.wait(0.1):
                peak[0] = max(peak[0], controller.num_fds())

        watcher = threading.Thread(target=watch)
        watcher.start()
        results = [json.loads(a.communicate(timeout=600)[0]) for a in flood]
        stop.set()
        watcher.join()
        ended = time.time()
        time.sleep(11)  # the period the attack ended in is journaled
        fds_after = controller.num_fds()
        run.proc.send_signal(2)
        run.wait(120)
    finally:
        run.close()
    job_dir = next(run_dir.iterdir())
    events = [json.loads(x) for x in (job_dir / "events.jsonl").read_text().splitlines()]
    faults = sum(e["kind"] == "fault_detected" for e in events)
    p99_0, max_0, n_0 = lateness(events, 0, began)
    p99_1, max_1, n_1 = lateness(events, began, ended + 10)
    loris, flood_out = results
    detail = (f"{loris['opened']} slow connections opened, {flood_out['ok']} of {scrapes} "
              f"scrapes answered in {flood_out['seconds']} s; faults {faults}")  # fmt: skip
    return [
        {"when": "before attack", "fds": fds_before, "late_p99_ms": p99_0, "late_max_ms": max_0,
         "heartbeats": n_0, "detail": ""},
        {"when": "under attack", "fds": peak[0], "late_p99_ms": p99_1, "late_max_ms": max_1,
         "heartbeats": n_1, "detail": detail},
        {"when": "after attack", "fds": fds_after, "late_p99_ms": None, "late_max_ms": None,
         "heartbeats": None, "detail": ""},
    ]  # fmt: skip


def metrics_table(rows: list[dict]) -> str:
    return Table(
        [
            Column(key="when", header="metrics port", align="<"),
            Column(key="fds", header="controller fds", spec="d"),
            Column(key="late_p99_ms", header="heartbeat late p99 ms", spec="d"),
            Column(key="late_max_ms", header="late max ms", spec=".1f"),
            Column(key="heartbeats", header="heartbeats", spec="d"),
            Column(key="detail", header="detail", align="<"),
        ]
    ).render(rows)


def _timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """Wall seconds, peak RSS (MiB) and exit code of one command."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return time.monotonic() - t0, usage.ru_maxrss / 1024, proc.returncode


def listing_rows(root: Path, size_mb: int = 100) -> list[dict]:
    from ftrun.jobview.keeper import SummaryKeeper
    from ftrun.jobview.summary import SUMMARY_FILE

    run_dir = root / "runs"
    job_dir = run_dir / "long-1"
    job_dir.mkdir(parents=True, mode=0o700)
    os.chmod(run_dir, 0o700)
    longjournal.write_journal(job_dir / "events.jsonl", size_mb << 20)
    env = {**os.environ, "FTRUN_RUN_DIR": str(run_dir), "COLUMNS": "150"}
    ftrun = [sys.executable, "-m", "ftrun"]
    commands = {
        "status": ["status"],
        "status JOB": ["status", "long-1"],
        "inspect": ["inspect", "long-1"],
        "inspect --json": ["inspect", "long-1", "--json"],
        "inspect --html": ["inspect", "long-1", "--html", str(root / "t.html")],
    }
    rows = []
    for with_summary in (False, True):
        if with_summary:  # what the controller's summary thread leaves (once, at the end)
            t0 = time.monotonic()
            keeper = SummaryKeeper(job_dir)
            keeper.round(final=True)
            keeper.stop()
            made = time.monotonic() - t0
            size = (job_dir / SUMMARY_FILE).stat().st_size
            rows.append({"command": f"(summary made from scratch: {size >> 10} KiB)",
                         "summary": "", "s": made, "mib": None})  # fmt: skip
        for name, args in commands.items():
            wall, mib, code = _timed([*ftrun, *args], env)
            assert code == 0, (name, code)
            rows.append({"command": name, "summary": "yes" if with_summary else "no (old job)",
                         "s": wall, "mib": mib})  # fmt: skip
    return rows


def listing_table(rows: list[dict], size_mb: int = 100) -> str:
    return Table(
        [
            Column(key="command", header=f"on a {size_mb} MB journal", align="<"),
            Column(key="summary", header="summary", align="<"),
            Column(key="s", header="s", spec=".2f"),
            Column(key="mib", header="peak MiB", spec=".0f"),
        ]
    ).render(rows)
