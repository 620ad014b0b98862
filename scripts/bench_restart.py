#!/usr/bin/env python3
"""Restart in place: fault → first step again, ftrun vs plain `torchrun --max-restarts`.

The same small DDP script (tests/bin/train_toy.py: torch.save every 10 steps, each step's time
logged) runs under each launcher in turn, alternating, several trials each; rank 1 SIGKILLs itself
at the same step in every trial (once per trial, via a marker file). For each trial we read,
from the run's own output, the time of the fault and the time of the first step after the restart.

    python scripts/bench_restart.py [--trials 5] [--nproc 2]

Prints median and spread per launcher, the ratio ftrun/torchrun (target ≤ 0.5, DESIGN.md §9)
and how many restarts failed (did not finish, or took more than --slow-s to come back).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

import benchlib
from benchlib import Column, Run, Table

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "bin" / "train_toy.py"
FAULT = re.compile(r"FAULT t=([\d.]+)")
STEP = re.compile(r"STEP (\d+) t=([\d.]+)")


def launcher_cmd(name: str, nproc: int, run_dir: str) -> list[str]:
    py = sys.executable
    if name == "torchrun":
        return [
            py,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            "--max-restarts",
            "3",
        ]
    start = "--cold-start" if name == "ftrun-cold" else "--warm-start"
    return [
        py,
        "-m",
        "ftrun",
        "launch",
        start,
        "--run-dir",
        run_dir,
        "--nproc-per-node",
        str(nproc),
        "--max-restarts",
        "3",
    ]


def trial(name: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp:
        cmd = launcher_cmd(name, args.nproc, os.path.join(tmp, "runs")) + [
            str(SCRIPT),
            "--steps",
            str(args.steps),
            "--ckpt-dir",
            tmp,
            "--ckpt-every",
            "10",
            "--fail-at",
            str(args.fail_at),
            "--fail-rank",
            "1",
            "--fail-once",
            os.path.join(tmp, "failed"),
            "--step-time",
            str(args.step_time),
            "--width",
            "256",
        ]
        run = Run(cmd)
        try:
            rc = run.wait(args.timeout_s)  # None: still running, killed below
        finally:
            run.close()  # a hung launcher's workers live in sessions of their own
        text, wall = run.text(), run.wall_s
    fault = FAULT.search(text)
    recovered = None
    if fault:
        fault_t = float(fault.group(1))
        after = text[fault.end() :]
        resumed = after.find("resumed from step")
        if resumed >= 0:
            steps = [float(m.group(2)) for m in STEP.finditer(after[resumed:])]
            if steps:
                recovered = min(steps) - fault_t
    failed = rc != 0 or recovered is None or recovered > args.slow_s
    return {"launcher": name, "rc": rc, "recovered_s": recovered, "wall_s": wall, "failed": failed}


def summarize(results: list[dict], name: str) -> dict:
    s = benchlib.summarize(
        None if r["failed"] else r["recovered_s"] for r in results if r["launcher"] == name
    )
    return {"launcher": name, **s.as_dict()}


TABLE = Table(
    [
        Column(key="launcher", header="launcher", align="<"),
        Column(key="trials", header="trials"),
        Column(key="failed", header="failed"),
        Column(key="median_s", header="median s", spec=".3f", ratio=".3f"),
        Column(key="min_s", header="min s", spec=".3f"),
        Column(key="max_s", header="max s", spec=".3f"),
        Column(key="stdev_s", header="stdev", spec=".3f"),
    ],
    name="launcher",
    anchor="torchrun",
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--fail-at", type=int, default=25)
    p.add_argument("--step-time", type=float, default=0.02)
    p.add_argument(
        "--slow-s", type=float, default=30.0, help="a restart slower than this counts as failed"
    )
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument("--launchers", default="torchrun,ftrun,ftrun-cold")
    p.add_argument("--json", default=None, help="also write every trial to this file")
    args = p.parse_args()

    names = args.launchers.split(",")
    results = []
    for i in range(args.trials):
        for name in names:  # alternate, so drift on a shared machine hits every launcher alike
            r = trial(name, args)
            results.append(r)
            shown = "FAILED" if r["failed"] else f"{r['recovered_s']:.3f} s"
            print(
                f"trial {i + 1}/{args.trials} {name:<10} fault → first step again: {shown}"
                f"  (rc={r['rc']}, wall {r['wall_s']:.1f} s)",
                flush=True,
            )
    summary = [summarize(results, n) for n in names]
    print()
    print(TABLE.render(summary))
    if args.json:
        benchlib.write_json(args.json, {"trials": results, "summary": summary})
    by = {s["launcher"]: s for s in summary}
    r = benchlib.ratio(by.get("ftrun", {}).get("median_s"), by.get("torchrun", {}).get("median_s"))
    if r is not None:
        print(f"\nratio ftrun/torchrun (median fault → first step again): {r:.3f}  (target ≤ 0.5)")
    print(
        "failed restarts: "
        + ", ".join(f"{s['launcher']} {s['failed']}/{s['trials']}" for s in summary)
    )


if __name__ == "__main__":
    with benchlib.scratch_tmpdir():
        main()
