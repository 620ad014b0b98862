"""Attacks against a job under load: is every one refused, does the job survive, is anything
written outside the job's directory, and what does the job pay for being attacked?

A real 2-rank DDP job (tests/bin/train_toy.py, gloo on CPU, both cores busy) runs under
`ftrun launch`. Once it steps, every attack of scripts/attacks.py runs against its controller,
one after another. The anchor is the same job's own step time before the attacks; the ratio is
its step time while under attack over that.

    .venv/bin/python scripts/bench_hostile.py [--steps 400] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import attacks
import benchlib
import psutil
from benchlib import Column, Table

ROOT = Path(__file__).resolve().parent.parent
STEP = re.compile(r"\[rank0\]: STEP (\d+) t=([\d.]+)")


def step_times(lines: list[str], start: float, end: float) -> list[float]:
    """Seconds between consecutive rank-0 steps whose time falls in [start, end)."""
    stamps = [float(m.group(2)) for line in lines if (m := STEP.search(line))]
    inside = [t for t in stamps if start <= t < end]
    return [b - a for a, b in zip(inside, inside[1:], strict=False)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=400, help="the job's steps (long enough to last)")
    p.add_argument("--width", type=int, default=256, help="the toy model's width (its load)")
    p.add_argument("--json", default=None, help="also write the figures here")
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as scratch, benchlib.scratch_tmpdir():
        root = Path(scratch)
        run_dir = root / "runs"
        cmd = [
            sys.executable, "-m", "ftrun", "launch", "--nproc-per-node", "2",
            str(ROOT / "tests" / "bin" / "train_toy.py"),
            "--steps", str(args.steps), "--width", str(args.width), "--step-time", "0.02",
        ]  # fmt: skip
        run = benchlib.Run(cmd, env={"FTRUN_RUN_DIR": str(run_dir), "OMP_NUM_THREADS": "1"})
        try:
            if run.wait_for(r"\[rank0\]: STEP 20 ", 120) is None:
                print(run.tail(3000), file=sys.stderr)
                raise SystemExit("the job did not reach step 20")
            job_dir = next(run_dir.glob("*/control.json")).parent
            controller = psutil.Process(run.proc.pid)
            fds_before, rss_before = controller.num_fds(), controller.memory_info().rss
            began = time.time()
            outcomes = []
            for attack in attacks.ATTACKS:
                t0 = time.time()
                outcome = asyncio.run(attack(attacks.Target.of_job(job_dir)))
                outcomes.append((outcome, time.time() - t0))
            ended = time.time()
            fds_after, rss_after = controller.num_fds(), controller.memory_info().rss
            code = run.wait(600)
        finally:
            run.close()
        events = attacks.events(job_dir)
        finished = events[-1] if events and events[-1]["kind"] == "job_finished" else {}
        survived = code == 0 and finished.get("state") == "succeeded"
        restarts = sum(e["kind"] == "generation_launched" for e in events) - 1
        outside = attacks.written_outside(root, job_dir, began)
        before = step_times(run.lines, 0, began)
        during = step_times(run.lines, began, ended)

    rows = [
        {
            "attack": o.attack,
            "outcome": "refused" if o.refused else "NOT REFUSED",
            "survived": "yes" if survived else "NO",
            "outside_bytes": outside,
            "seconds": s,
            "detail": o.detail,
        }
        for o, s in outcomes
    ]
    table = Table(
        [
            Column(key="attack", header="attack", align="<"),
            Column(key="outcome", header="outcome", align="<"),
            Column(key="survived", header="job survived", align="<"),
            Column(key="outside_bytes", header="bytes outside job", spec="d"),
            Column(key="seconds", header="s", spec=".1f"),
            Column(key="detail", header="detail", align="<"),
        ]
    )
    print(table.render(rows))
    med_before = statistics.median(before) if before else None
    med_during = statistics.median(during) if during else None
    step_table = Table(
        [
            Column(key="when", header="", align="<"),
            Column(key="step_s", header="median step s", spec=".4f", ratio=".2f"),
        ],
        name="when",
        anchor="before attacks",
    )
    step_rows = [
        {"when": "before attacks", "step_s": med_before},
        {"when": "under attack", "step_s": med_during},
    ]
    print()
    print(step_table.render(step_rows))
    print(
        f"\njob exit {code}, state {finished.get('state')}, restarts forced {restarts}; "
        f"controller fds {fds_before} -> {fds_after}, "
        f"RSS {rss_before / 2**20:.1f} -> {rss_after / 2**20:.1f} MiB; "
        f"refusals journaled: "
        f"{sum(e['kind'] in ('message_refused', 'connection_refused') for e in events)}"
    )
    if args.json:
        benchlib.write_json(
            args.json,
            {
                "attacks": rows,
                "steps": step_rows,
                "exit_code": code,
                "restarts_forced": restarts,
                "fds": [fds_before, fds_after],
                "rss_bytes": [rss_before, rss_after],
            },
        )
    ok = survived and outside == 0 and all(o.refused for o, _ in outcomes)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
