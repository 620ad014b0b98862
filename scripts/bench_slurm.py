"""ftrun under Slurm next to plain `srun torchrun`, on the Slurm testbed (scripts/slurm_testbed.sh),
in one run: submit → first step; a node lost → first step again (with a spare, and by shrinking);
a preemption notice → the requeued job's first step, and the steps lost to it.

    python scripts/bench_slurm.py [--trials N] [--json FILE]
    python scripts/bench_slurm.py --only batch-node [--trials N] [--json FILE]

`--only batch-node`: the batch node's power loss, ftrun 3+1 against plain torchrun on 3 nodes, on
a 5-node bed (scripts/bench_slurm_batch.py says what it measures).

Both jobs run tests/bin/ckpt_train.py on 2 nodes × 1 rank (gloo, CPU). The plain job is the batch
script people write: `srun --unbuffered --ntasks-per-node=1 torchrun --nnodes 2 --rdzv-backend
c10d ...` with `--max-restarts 3` (`--unbuffered`, so that its steps are seen when they happen). torchrun cannot replace a node: after the power loss the table says what it
did within --wait seconds: it cannot go on without the node, and (JobRequeue=1, the default
here and on many clusters) Slurm requeues the whole job once the node is declared down, and it
starts over on other nodes. It has no checkpoint-then-requeue on a notice. A node is powered off (its slurmd, steps and tasks
killed, `slurm_testbed.sh kill`) once rank 0 printed step 10; the notice is
`scancel --batch --signal=USR2`, what `--signal=B:USR2@T` sends at a time of Slurm's choosing.
Times are wall clock on this (shared, 2-core) machine: read the ratios.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_slurm_batch
import benchlib
from benchlib import Column, Table
from slurm_bench_bed import ROOT, Bed, Follower, free_port, made

TRAIN = str(ROOT / "tests" / "bin" / "ckpt_train.py")
ARGS = ["--steps", "150", "--step-time", "0.1"]


def ftrun_trial(bed: Bed, run_dir: Path, *, spares: int, wait_s: float) -> dict[str, Any]:
    """Submit, lose node2 at step 10 (a spare takes over, or the job shrinks), then (with a
    spare) a preemption notice at step 30 of the new generation: figures of each."""
    t0 = time.monotonic()
    submitted = json.loads(
        bed.run(
            sys.executable, "-m", "ftrun", "sbatch", "--json", "--run-dir", str(run_dir),
            "--nodes", "2", "--spares", str(spares), "--", TRAIN, *ARGS,
        )
    )  # fmt: skip
    job_dir = Path(submitted["job_dir"])
    follow = Follower(job_dir)
    row: dict[str, Any] = {"first_step_s": follow.step_after(t0, wait_s)}
    if row["first_step_s"] is None or not follow.reached(10, wait_s):
        return row
    lost_t = time.monotonic()
    bed.power_off("node2")
    row["node_lost_s"] = follow.step_after(lost_t, wait_s)
    if spares and row["node_lost_s"] is not None and follow.reached(30, wait_s):
        notice_t = time.monotonic()
        bed.run("scancel", "--batch", "--signal=USR2", submitted["slurm_job_id"])
        row["requeue_s"] = follow.step_after(notice_t + 0.5, wait_s * 2)
        events = [json.loads(x) for x in (job_dir / "events.jsonl").read_text().splitlines()]
        preempted = [e for e in events if e.get("fault") == "preempted"]
        ended = [e for e in events if e["kind"] == "generation_ended"]
        if preempted and preempted[0].get("committed_step") is not None:
            gen = preempted[0]["gen"]
            last = next(e["step"] for e in ended if e["gen"] == gen)
            row["steps_lost"] = last - preempted[0]["committed_step"]
    deadline = time.monotonic() + wait_s * 2
    while bed.state(submitted["slurm_job_id"]).split()[0] not in (
        "COMPLETED",
        "FAILED",
        "CANCELLED",
    ):
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    row["end"] = bed.state(submitted["slurm_job_id"])
    return row


PLAIN = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --output={out}/slurm-%j.out
#SBATCH --open-mode=append
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -1)
srun --unbuffered --ntasks-per-node=1 {python} -m torch.distributed.run --nnodes 2 --nproc-per-node 1 \\
    --max-restarts 3 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{port} \\
    {train} {args} --ckpt-dir {out}/ckpt
"""


def plain_trial(bed: Bed, out: Path, *, wait_s: float) -> dict[str, Any]:
    out.mkdir(parents=True)
    script = out / "plain.sh"
    script.write_text(
        PLAIN.format(
            out=out,
            python=sys.executable,
            port=free_port(),
            train=TRAIN,
            args=" ".join(ARGS),
        )
    )
    t0 = time.monotonic()
    job_id = bed.run("sbatch", "--parsable", str(script)).strip().split(";")[0]
    follow = Follower(out)
    row: dict[str, Any] = {"first_step_s": follow.step_after(t0, wait_s)}
    if row["first_step_s"] is not None and follow.reached(10, wait_s):
        lost_t = time.monotonic()
        bed.power_off("node2")
        row["node_lost_s"] = follow.step_after(lost_t, wait_s)
        row["end"] = f"{bed.state(job_id)} after {wait_s:g} s"
        tail = "".join(p.read_text(errors="replace") for p in out.glob("slurm-*.out"))
        row["last_lines"] = [line[:160] for line in tail.splitlines()[-4:]]
    bed.cancel_all()
    return row


TABLE = Table(
    [
        Column(key="launcher", header="launcher", align="<"),
        Column(key="first_step_s", header="submit→step s", spec=".2f", ratio=".2f"),
        Column(key="node_lost_s", header="node lost→step s", spec=".2f", ratio=".2f"),
        Column(key="requeue_s", header="notice→requeued step s", spec=".2f"),
        Column(key="steps_lost", header="steps lost/requeue"),
        Column(key="end", header="job end", align="<"),
    ],
    name="launcher",
    anchor="srun torchrun",
)


def one(name: str, bed: Bed, tmp: Path, trial: int, wait_s: float) -> dict[str, Any]:
    if name == "srun torchrun":
        return plain_trial(bed, tmp / f"plain{trial}", wait_s=wait_s)
    spares = 1 if name == "ftrun spare" else 0
    return ftrun_trial(bed, tmp / "runs", spares=spares, wait_s=wait_s)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=1)
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for each phase")
    p.add_argument("--json", help="also write the figures here")
    p.add_argument(
        "--only",
        choices=["batch-node"],
        help="batch-node: the batch node's power loss alone, 3+1 nodes on a 5-node bed "
        "(scripts/bench_slurm_batch.py)",
    )
    p.add_argument("--persist-every", type=int, default=5, help="batch-node: steps per persist")
    p.add_argument(
        "--keep-output",
        help="batch-node: keep each job's Slurm output (and ftrun's job directory) in this folder",
    )
    args = p.parse_args()
    # SIGTERM unwinds like Ctrl-C, so that the testbed and the temp dir are taken down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.only == "batch-node":
        bench_slurm_batch.main(args)
        return
    rows: dict[str, list[dict[str, Any]]] = {
        "srun torchrun": [],
        "ftrun spare": [],
        "ftrun shrink": [],
    }
    with (
        tempfile.TemporaryDirectory(prefix="ftrun-bench-slurm-") as tmp,
        Bed(f"{tmp}/bed", scratch=made(f"{tmp}/scratch")) as bed,
    ):
        for trial in range(args.trials):
            for name in rows:
                try:
                    rows[name].append(one(name, bed, Path(tmp), trial, args.wait))
                finally:
                    bed.cancel_all()
                    bed.power_on("node2")
                print(f"trial {trial + 1} {name}: {rows[name][-1]}", file=sys.stderr)
    table = []
    for name, trials in rows.items():
        row: dict[str, Any] = {"launcher": name}
        for key in ("first_step_s", "node_lost_s", "requeue_s", "steps_lost"):
            row[key] = benchlib.median(t.get(key) for t in trials)
        row["end"] = "; ".join(str(t.get("end", "-")) for t in trials)
        table.append(row)
    print(TABLE.render(table))
    if args.json:
        benchlib.write_json(args.json, {"trials": rows, "table": table})


if __name__ == "__main__":
    main()
