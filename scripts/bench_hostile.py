"""Attacks against a job under load: is every one refused, does the job survive, is anything
written outside the job's directory, and what does the job pay for being attacked?

A real 2-rank DDP job (tests/bin/train_toy.py, gloo on CPU, both cores busy) runs under
`ftrun launch`. Once it steps, every attack of scripts/attacks.py runs against its controller,
one after another. Then (as root) a second job whose /dev/shm memory tier another user made
first. The anchor is the same job's own step time before the attacks; the ratio is
its step time while under attack over that. Then (scripts/hostile_figures.py) the metrics
port under 1,000 slowloris connections and 10,000 scrapes (descriptors and heartbeat lateness
before and under the attack), and listings on a 100 MB journal (time and memory).

    .venv/bin/python scripts/bench_hostile.py [--steps 400] [--json out.json]
        [--only metrics,listing]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import attacks
import benchlib
import hostile_figures
import psutil
from benchlib import Column, Table

ROOT = Path(__file__).resolve().parent.parent
STEP = re.compile(r"\[rank0\]: STEP (\d+) t=([\d.]+)")


def step_times(lines: list[str], start: float, end: float) -> list[float]:
    """Seconds between consecutive rank-0 steps whose time falls in [start, end)."""
    stamps = [float(m.group(2)) for line in lines if (m := STEP.search(line))]
    inside = [t for t in stamps if start <= t < end]
    return [b - a for a, b in zip(inside, inside[1:], strict=False)]


def _ms(late: tuple[float | None, float | None, int]) -> str:
    p99, top, n = late
    return "no sample" if not n else f"{p99:.0f}/{top:.0f} ms ({n} beats)"


def planted_memory_tier(root: Path) -> tuple[attacks.Outcome, str, int]:
    """Another user made `/dev/shm/ftrun-<job>` before the job (a job id is easy to guess),
    where the tier used to be: the tier is now in the user's private parent
    (`/dev/shm/ftrun-<uid>/<job>`), so the job must not touch the planted directory and finish
    as usual. Needs root (to be "another user")."""
    job_id = f"hostile-{uuid.uuid4().hex[:8]}"
    tier = Path("/dev/shm") / f"ftrun-{job_id}"
    tier.mkdir(mode=0o700)
    planted = tier / "slot0.data"
    planted.write_bytes(b"theirs")
    for path in (planted, tier):
        os.chown(path, 65534, 65534)
    began = time.time()
    cmd = [
        sys.executable, "-m", "ftrun", "launch", "--job-id", job_id, "--max-restarts", "0",
        str(ROOT / "tests" / "bin" / "ckpt_train.py"), "--steps", "5",
    ]  # fmt: skip
    run = benchlib.Run(cmd, env={"FTRUN_RUN_DIR": str(root / "runs"), "OMP_NUM_THREADS": "1"})
    try:
        code = run.wait(180)
    finally:
        run.close()
    try:
        intact = planted.read_bytes() == b"theirs" and sorted(os.listdir(tier)) == ["slot0.data"]
    finally:
        shutil.rmtree(tier, ignore_errors=True)
    job_dir = root / "runs" / job_id
    outside = attacks.written_outside(root, job_dir, began)
    harmless = code == 0 and intact
    outcome = attacks.Outcome(
        "another user's /dev/shm/ftrun-<job>, made before the job",
        harmless,
        "not the tier any more: untouched, job finished" if harmless else f"exit {code}",
    )
    return outcome, "yes" if harmless else "NO", outside


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=400, help="the job's steps (long enough to last)")
    p.add_argument("--width", type=int, default=256, help="the toy model's width (its load)")
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--only", default=None, help="only these figures: metrics, listing (commas)")
    args = p.parse_args()
    if args.only:
        return figures(args.only.split(","), args.json)

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
            fds_by_attack: list[int] = []
            for attack in attacks.ATTACKS:
                t0 = time.time()
                outcome = asyncio.run(attack(attacks.Target.of_job(job_dir)))
                outcomes.append((outcome, time.time() - t0))
                fds_by_attack.append(controller.num_fds())  # what the attack left open
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

    late_before = hostile_figures.lateness(events, 0.0, began)
    late_under = hostile_figures.lateness(events, began, ended + 11.0)  # the period they ended in
    rows = [
        {
            "attack": o.attack,
            "fds": fds,
            "outcome": "refused" if o.refused else "NOT REFUSED",
            "survived": "yes" if survived else "NO",
            "outside_bytes": outside,
            "seconds": s,
            "detail": o.detail,
        }
        for (o, s), fds in zip(outcomes, fds_by_attack, strict=True)
    ]
    if os.geteuid() == 0:
        with tempfile.TemporaryDirectory(prefix="bench-hostile-") as scratch:
            t0 = time.time()
            tier, ended, tier_outside = planted_memory_tier(Path(scratch))
        outcomes.append((tier, time.time() - t0))
        rows.append(
            {
                "attack": tier.attack,
                "outcome": "refused" if tier.refused else "NOT REFUSED",
                "survived": ended,
                "outside_bytes": tier_outside,
                "seconds": time.time() - t0,
                "detail": tier.detail,
            }
        )
        outside += tier_outside
    table = Table(
        [
            Column(key="attack", header="attack", align="<"),
            Column(key="outcome", header="outcome", align="<"),
            Column(key="survived", header="job survived", align="<"),
            Column(key="outside_bytes", header="bytes outside job", spec="d"),
            Column(key="fds", header="controller fds after", spec="d"),
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
        f"controller fds {fds_before} -> {fds_after}, heartbeat lateness p99/max "
        f"{_ms(late_before)} before the attacks, {_ms(late_under)} under them; "
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
                "heartbeat_late_ms": {"before": late_before[:2], "under": late_under[:2]},
                "rss_bytes": [rss_before, rss_after],
            },
        )
    ok = survived and outside == 0 and all(o.refused for o, _ in outcomes)
    print()
    return figures(["metrics", "listing"], None) or (0 if ok else 1)


def figures(which: list[str], json_path: str | None) -> int:
    """Issue 34's rows for the metrics port and the listings (scripts/hostile_figures.py)."""
    out: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as scratch, benchlib.scratch_tmpdir():
        if "metrics" in which:
            (Path(scratch) / "m").mkdir()
            out["metrics"] = hostile_figures.metrics_rows(Path(scratch) / "m")
            print(hostile_figures.metrics_table(out["metrics"]))
            print()
        if "listing" in which:
            (Path(scratch) / "l").mkdir()
            out["listing"] = hostile_figures.listing_rows(Path(scratch) / "l")
            print(hostile_figures.listing_table(out["listing"]))
    if json_path:
        benchlib.write_json(json_path, out)
    under = next((r for r in out.get("metrics", []) if r["when"] == "under attack"), None)
    return 1 if under is not None and under["fds"] - out["metrics"][0]["fds"] >= 100 else 0


if __name__ == "__main__":
    raise SystemExit(main())
