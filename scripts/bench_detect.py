#!/usr/bin/env python3
"""Detection latency for a crash, a hang and a lost host: ftrun vs plain torchrun, one run.

The same script (tests/bin/train_toy.py, 2 ranks, DDP on gloo, 20 ms steps) under each launcher:
  crash      rank 1 SIGKILLs itself at step 20 (it prints the time first);
  hang       rank 1 SIGSTOPs itself at step 20 (likewise): the process is there and does nothing;
  deadlock   rank 1 waits at step 20 for an event that never comes (likewise), and rank 0 for it
             in the next all-reduce: every rank waits, none uses CPU;
  host lost  ftrun: `ftrun chaos JOB freeze-agent` at step 20 (the host's agent stops answering);
             torchrun: two torchrun "nodes" on this machine (c10d rendezvous), and every process
             of node 2 is SIGSTOPped at step 20.
Detection time: ftrun's journal (fault_detected); torchrun's own log line that reports the
failure. What torchrun has not reported within --wait-s counts as "not detected within N s".

    python scripts/bench_detect.py [--trials 3] [--wait-s 30]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib
import psutil
from benchlib import Column, Run, Table

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "tests" / "bin" / "train_toy.py")
PY = sys.executable
FAULT = re.compile(r"FAULT t=([\d.]+)")
# torchrun (torch.distributed.elastic) logs a failed worker as, e.g.
# E1121 23:25:01.123000 123 .../api.py:874] failed (exitcode: -9) local_rank: 1 (pid: 9) of binary
TORCHRUN_FAILED = re.compile(r"^E(\d{4}) (\d\d:\d\d:\d\d\.\d+) .*failed \(exitcode", re.M)
TRAIN = ["--steps", "100000", "--step-time", "0.02", "--width", "64"]
TARGETS = {
    "crash": "≤ 0.2 s",
    "hang": "≤ 2 s past the allowance (2 s floor)",
    "deadlock": "≤ 2 s past the allowance (2 s floor)",
    "host-lost": "≤ 1.5 s",
}


def torchrun_detected_t(text: str) -> float | None:
    m = TORCHRUN_FAILED.search(text)
    if not m:
        return None
    today = dt.date.today()
    stamp = dt.datetime.strptime(f"{today.year}{m.group(1)} {m.group(2)}", "%Y%m%d %H:%M:%S.%f")
    return stamp.timestamp()


def ftrun_incident(run_dir: str) -> dict | None:
    jobs = list(Path(run_dir).iterdir())
    if not jobs:
        return None
    for line in (jobs[0] / "events.jsonl").read_text().splitlines():
        ev = json.loads(line)
        if ev["kind"] == "fault_detected":
            return ev
    return None


def ftrun_trial(kind: str, wait_s: float) -> float | None:
    with tempfile.TemporaryDirectory(prefix="bench-detect-") as tmp:
        # On one machine a frozen agent is alive, so by default it is only "slow" (never lost on
        # silence alone, docs/timeouts.md); a local stall timeout equal to the lost timeout makes
        # the frozen agent stand for a frozen host, detected by silence as over ssh.
        base = [
            PY,
            "-m",
            "ftrun",
            "launch",
            "--run-dir",
            tmp,
            "--max-restarts",
            "0",
            "--local-stall-timeout",
            "1.0",
            "--nproc-per-node",
            "2",
            SCRIPT,
            *TRAIN,
        ]
        fail = {
            "crash": ["--fail-at", "20", "--fail-rank", "1", "--fail-how", "sigkill"],
            "hang": ["--fail-at", "20", "--fail-rank", "1", "--fail-how", "sigstop"],
            "deadlock": ["--fail-at", "20", "--fail-rank", "1", "--fail-how", "wait"],
        }
        run = Run(base + fail.get(kind, []))
        try:
            if kind == "host-lost":
                if not run.wait_for(r"STEP 20 ", 60):
                    return None
                job = next(Path(tmp).iterdir()).name
                subprocess.run(
                    [PY, "-m", "ftrun", "chaos", "--run-dir", tmp, job, "freeze-agent"],
                    check=True,
                    capture_output=True,
                    timeout=30,
                )
            run.proc.wait(timeout=60 + wait_s)
            inc = ftrun_incident(tmp)
            if inc is None:
                return None
            detected = inc.get("detected_t") or inc["t"]
            if kind == "host-lost":
                return detected - inc["fault_t"]
            fault = FAULT.search(run.text())
            return detected - float(fault.group(1)) if fault else None
        finally:
            run.close()


def torchrun_trial(kind: str, wait_s: float) -> float | None:
    if kind == "host-lost":
        return torchrun_host_lost(wait_s)
    fail = [
        "--fail-at",
        "20",
        "--fail-rank",
        "1",
        "--fail-how",
        {"crash": "sigkill", "deadlock": "wait"}.get(kind, "sigstop"),
    ]
    run = Run(
        [
            PY,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "0",
            SCRIPT,
            *TRAIN,
            *fail,
        ]
    )
    try:
        fault = run.wait_for(r"FAULT t=([\d.]+)", 60)
        if not fault:
            return None
        run.wait_for(TORCHRUN_FAILED, wait_s)
        detected = torchrun_detected_t(run.text())
        return None if detected is None else detected - float(fault.group(1))
    finally:
        run.close()


def torchrun_host_lost(wait_s: float) -> float | None:
    with tempfile.TemporaryDirectory(prefix="bench-detect-") as tmp:
        port = _free_port()
        node = [
            PY,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            "bench",
            "--max-restarts",
            "0",
            SCRIPT,
            *TRAIN,
            "--ckpt-dir",
            tmp,
        ]
        first, second = Run(list(node)), Run(list(node))
        try:
            if not first.wait_for(r"STEP 20 ", 90):
                return None
            fault_t = time.time()
            victims = [
                psutil.Process(second.proc.pid),
                *psutil.Process(second.proc.pid).children(True),
            ]
            for p in victims:
                p.suspend()
            first.wait_for(TORCHRUN_FAILED, wait_s)
            detected = torchrun_detected_t(first.text())
            return None if detected is None else detected - fault_t
        finally:
            for p in benchlib.tagged(first.tag, second.tag):
                try:
                    p.resume()
                except psutil.Error:
                    continue
            first.close()
            second.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TABLE = Table(
    [
        Column(key="fault", header="fault", align="<"),
        Column(key="launcher", header="launcher", align="<"),
        Column(key="detected", header="detected"),
        Column(key="median_s", header="median s", spec=".3f", ratio=".3f"),
        Column(key="min_s", header="min s", spec=".3f"),
        Column(key="max_s", header="max s", spec=".3f"),
        Column(key="note", header="target", align="<"),
    ],
    name="launcher",
    anchor="torchrun",
    group="fault",
)


def row(kind: str, name: str, values: list[float | None], wait_s: float) -> dict:
    """A launcher's figures for one kind of fault; none unless every trial was detected."""
    s = benchlib.summarize(values)
    if s.failed:
        return {
            "fault": kind,
            "launcher": name,
            "detected": f"{s.ok}/{s.trials}",
            "note": f"not detected within {wait_s:g} s in {s.failed}/{s.trials}",
        }
    return {
        "fault": kind,
        "launcher": name,
        "detected": f"{s.ok}/{s.trials}",
        "median_s": s.median,
        "min_s": s.min,
        "max_s": s.max,
        "note": TARGETS[kind] if name == "ftrun" else "",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--wait-s", type=float, default=30.0, help="how long to wait for torchrun")
    p.add_argument("--kinds", default="crash,hang,deadlock,host-lost")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    results: dict[tuple[str, str], list[float | None]] = {}
    for trial in range(args.trials):
        for kind in args.kinds.split(","):
            for name, fn in (("ftrun", ftrun_trial), ("torchrun", torchrun_trial)):
                value = fn(kind, args.wait_s)
                results.setdefault((kind, name), []).append(value)
                shown = "not detected" if value is None else f"{value:.3f} s"
                print(
                    f"trial {trial + 1} {kind:<9} {name:<8} fault → detected: {shown}", flush=True
                )
    print()
    print(
        TABLE.render(
            [row(kind, name, values, args.wait_s) for (kind, name), values in results.items()]
        )
    )
    if args.json:
        benchlib.write_json(args.json, {f"{k}/{n}": v for (k, n), v in results.items()})


if __name__ == "__main__":
    with benchlib.scratch_tmpdir():
        main()
