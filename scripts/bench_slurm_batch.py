"""The batch node's power loss under Slurm (issue 36 item 3), ftrun next to plain torchrun in one
run: `python scripts/bench_slurm.py --only batch-node [--trials N] [--wait S] [--json FILE]`.

On a 5-node testbed, one job at a time: `ftrun sbatch --nodes 3 --spares 1`, and the plain batch
script on 3 nodes (`srun torchrun`, as in bench_slurm.py), both running tests/bin/ckpt_train.py
with a committed checkpoint every --persist-every steps. Once rank 0 printed step 10, the job's
batch node (node1: the batch script, and ftrun's controller) is powered off
(`slurm_testbed.sh kill`). Then, per launcher, all times from the power loss:

- whether it trained again within --wait, and when: the first step of a run restored after it;
- Slurm's side, from scontrol every 0.2 s: requeued (the job's Restarts went up), running again;
- for ftrun, the phases its journal holds for the `batch-node-lost` incident (`ftrun inspect
  --json`): detected (an agent lost its controller), torn down (that agent's `scontrol
  requeue`), relaunched (the requeued run's first generation), first step again;
- steps lost: rank 0's last step before the loss minus the step the next run restored, against
  the persist interval;
- losses: whether every rank's loss at every step equals that of an uninterrupted run
  (`ftrun launch` of the same script on 3 local ranks, once per bench run). With 3 ranks a
  resumed run is not bit-exact today, under either launcher and without Slurm too: a DDP made
  afresh sums its first all-reduce in another order (docs/slurm.md).

--keep-output DIR keeps each trial's Slurm output, and ftrun's job directory (its journal and
agents' logs, without checkpoints or secrets), to tell why a trial went as it did.

The plain script has no `--no-kill` (people do not write it), so Slurm itself requeues it once it
marks the node DOWN (JobRequeue=1, Slurm's default and this bed's); the script restores the
checkpoints it keeps. On a cluster with JobRequeue=0, or with `--no-requeue`, it ends NODE_FAIL.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchlib
from benchlib import Column, Table
from slurm_bench_bed import ROOT, Bed, Follower, free_port, made

TRAIN = str(ROOT / "tests" / "bin" / "ckpt_train.py")
NODES = 3
LOSE_AT = 10  # rank 0's step after which the batch node loses power
# A loss is float.hex(). srun --unbuffered passes bytes on as they come, not lines: another task's
# line may follow a loss on the same line (kept), or cut into it (then it does not match, and
# that rank-step counts as not in the output).
LOSS = re.compile(r"LOSS rank=(\d+) step=(\d+) loss=(-?0x[0-9a-f.]+p[-+]\d+)(?![0-9a-fp.])")
RESTORED = re.compile(r"RESTORED rank=0 step=(\d+) ")
# The journal's phases of the incident, by the name of their figure here.
PHASES = {
    "detected": "detected_s",
    "torn down": "torn_down_s",
    "relaunched": "relaunched_s",
    "first step again": "journal_step_s",
}


def train_args(persist_every: int, *, step_time: bool = True) -> list[str]:
    pace = ["--step-time", "0.1"] if step_time else []
    return ["--steps", "150", *pace, "--persist-every", str(persist_every)]


def reference_losses(env: dict[str, str], run_dir: Path, persist_every: int) -> str:
    """The output of an uninterrupted run of the same script on 3 local ranks."""
    argv = [sys.executable, "-m", "ftrun", "launch", "--run-dir", str(run_dir)]
    argv += ["--nproc-per-node", str(NODES), TRAIN, *train_args(persist_every, step_time=False)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"the reference run exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout + done.stderr


def compare_losses(text: str, reference: str) -> str:
    """`same` when every (rank, step) of the reference that `text` shows has the same loss
    there (both times for a step done twice: before the loss, and again after the restore);
    else how many differ, and the first. Whether the run finished is for the job end to say."""
    want = {(int(r), int(s)): loss for r, s, loss in LOSS.findall(reference)}
    seen: dict[tuple[int, int], set[str]] = {}
    for r, s, loss in LOSS.findall(text):
        seen.setdefault((int(r), int(s)), set()).add(loss)
    differ = sorted((s, r) for (r, s), loss in want.items() if seen.get((r, s), {loss}) != {loss})
    if differ:
        return f"{len(differ)} of {len(want)} differ, from rank {differ[0][1]} step {differ[0][0]}"
    missing = len(set(want) - set(seen))
    return f"same ({missing} of {len(want)} not in the output)" if missing else "same"


def steps_lost(text: str) -> int | None:
    """Rank 0's last step before the last restore minus the step that restore resumed from."""
    restores = list(RESTORED.finditer(text))
    if len(restores) < 2:
        return None
    before = [int(m.group(2)) for m in LOSS.finditer(text, 0, restores[-1].start()) if m[1] == "0"]
    # Rank 0 did the step it restored, even when that line did not reach the output in time.
    return max(0, max(before) - int(restores[-1].group(1))) if before else None


def output(directory: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(directory.glob("slurm-*.out")))


def lose_batch_node(bed: Bed, follow: Follower, job_id: str, t0: float, wait_s: float) -> dict:
    """First step, the batch node powered off at step LOSE_AT, then Slurm's and the output's
    side of the recovery, watched until the first step again or `wait_s`."""
    row: dict[str, Any] = {"first_step_s": follow.step_after(t0, wait_s), "again": "no"}
    if row["first_step_s"] is None:
        return row
    row["batch_host"] = bed.job(job_id).get("BatchHost")
    if not follow.reached(LOSE_AT, wait_s):
        return row
    lost_t, row["lost_wall"] = time.monotonic(), time.time()
    bed.power_off(row["batch_host"])
    while time.monotonic() < lost_t + wait_s:
        try:
            fields = bed.job(job_id)
        except RuntimeError:  # slurmctld busy: ask again
            fields = {}
        now = time.monotonic() - lost_t
        if fields.get("Restarts", "0") != "0":
            row.setdefault("requeued_s", round(now, 2))
            if fields.get("JobState") == "RUNNING":
                row.setdefault("running_s", round(now, 2))
        if (since := follow.step_since(lost_t)) is not None:
            row["again_s"], row["again"] = since, "yes"
            break
        time.sleep(0.2)  # poll interval
    return row


def journal_phases(bed: Bed, run_dir: Path, job: str, lost_wall: float) -> dict[str, Any]:
    """The batch-node-lost incident's phases from ftrun's journal, in seconds from the loss."""
    argv = [sys.executable, "-m", "ftrun", "inspect", job, "--json", "--run-dir", str(run_dir)]
    shown = json.loads(bed.run(*argv))
    incident = next((i for i in shown["incidents"] if i["kind"] == "batch-node-lost"), None)
    if incident is None:
        return {"journal": "no batch-node-lost incident"}
    row: dict[str, Any] = {"journal_lost_steps": incident["lost_steps"]}
    row["restored_step"] = incident["restored_step"]
    for name, t in incident["phases"].items():
        if name in PHASES and t is not None:
            row[PHASES[name]] = round(t - lost_wall, 2)
    return row


def ftrun_trial(bed: Bed, run_dir: Path, *, persist_every: int, wait_s: float) -> dict:
    t0 = time.monotonic()
    argv = [sys.executable, "-m", "ftrun", "sbatch", "--json", "--run-dir", str(run_dir)]
    argv += ["--nodes", str(NODES), "--spares", "1", "--nproc-per-node", "1", "--", TRAIN]
    submitted = json.loads(bed.run(*argv, *train_args(persist_every)))
    job_dir, job_id = Path(submitted["job_dir"]), submitted["slurm_job_id"]
    row = lose_batch_node(bed, Follower(job_dir), job_id, t0, wait_s)
    row["job_dir"] = str(job_dir)
    if row["again"] == "yes":
        row["end"] = bed.wait_end(job_id, wait_s * 2)
        row.update(journal_phases(bed, run_dir, submitted["job_id"], row["lost_wall"]))
    row["output"] = output(job_dir)
    return row


PLAIN = """#!/bin/bash
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --output={out}/slurm-%j.out
#SBATCH --open-mode=append
srun --unbuffered --ntasks-per-node=1 {python} -m torch.distributed.run --nnodes {nodes} \\
    --nproc-per-node 1 --max-restarts 3 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{port} \\
    {train} {args} --ckpt-dir {out}/ckpt
"""


def plain_trial(bed: Bed, out: Path, *, persist_every: int, wait_s: float) -> dict:
    out.mkdir(parents=True)
    script = out / "plain.sh"
    script.write_text(
        PLAIN.format(
            nodes=NODES,
            out=out,
            python=sys.executable,
            port=free_port(),
            train=TRAIN,
            args=" ".join(train_args(persist_every)),
        )
    )
    t0 = time.monotonic()
    job_id = bed.run("sbatch", "--parsable", str(script)).strip().split(";")[0]
    row = lose_batch_node(bed, Follower(out), job_id, t0, wait_s)
    if row["again"] == "yes":
        row["end"] = bed.wait_end(job_id, wait_s * 2)
    else:
        row["end"] = f"{bed.state(job_id)} after {wait_s:g} s"
    row["output"] = output(out)
    return row


TABLE = Table(
    [
        Column(key="launcher", header="launcher", align="<"),
        Column(key="again", header="trained again", align="<"),
        Column(key="again_s", header="power loss→step s", spec=".1f", ratio=".2f"),
        Column(key="detected_s", header="detected s", spec=".1f"),
        Column(key="requeued_s", header="requeued s", spec=".1f"),
        Column(key="running_s", header="running again s", spec=".1f"),
        Column(key="relaunched_s", header="relaunched s", spec=".1f"),
        Column(key="steps_lost", header="steps lost"),
        Column(key="persist_every", header="persist every"),
        Column(key="losses", header="losses vs uninterrupted", align="<"),
        Column(key="end", header="job end", align="<"),
    ],
    name="launcher",
    anchor="srun torchrun",
)
FIGURES = ("again_s", "detected_s", "requeued_s", "running_s", "relaunched_s", "steps_lost")


def keep(folder: str, name: str, text: str, row: dict[str, Any]) -> None:
    """A trial's Slurm output, and ftrun's job directory (its journal and agents' logs, to tell
    why the trial went as it did) without the checkpoints and the job's secrets."""
    kept = Path(folder, f"{name}.out")
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(text)
    if "job_dir" in row:
        skip = shutil.ignore_patterns("checkpoints", "*.key", "*.tls")
        shutil.copytree(row["job_dir"], kept.with_suffix(""), ignore=skip, symlinks=True)


def one(name: str, bed: Bed, tmp: Path, trial: int, args: argparse.Namespace) -> dict:
    every, wait_s = args.persist_every, args.wait
    if name == "srun torchrun":
        return plain_trial(bed, tmp / f"plain{trial}", persist_every=every, wait_s=wait_s)
    return ftrun_trial(bed, tmp / "runs", persist_every=every, wait_s=wait_s)


def main(args: argparse.Namespace) -> None:
    """Both launchers, --trials times, on one 5-node bed; the table, and --json."""
    rows: dict[str, list[dict[str, Any]]] = {"srun torchrun": [], "ftrun 3+1": []}
    with (
        tempfile.TemporaryDirectory(prefix="ftrun-bench-slurm-batch-") as tmp,
        Bed(f"{tmp}/bed", scratch=made(f"{tmp}/scratch"), nodes=5) as bed,
    ):
        # One thread per rank, as torchrun gives the reference's 3 ranks on one host (and as the
        # suite runs): 3 nodes' ranks with a thread per core would oversubscribe the 2 cores.
        bed.env["OMP_NUM_THREADS"] = "1"
        reference = reference_losses(bed.env, Path(tmp) / "reference", args.persist_every)
        if args.keep_output:
            Path(args.keep_output).mkdir(parents=True, exist_ok=True)
            Path(args.keep_output, "reference.out").write_text(reference)
        for trial in range(args.trials):
            for name, trials in rows.items():
                bed.wait_idle()
                try:
                    row = one(name, bed, Path(tmp), trial, args)
                finally:
                    bed.cancel_all()
                    for node in bed.nodes:  # the powered-off one; the others answer "running"
                        bed.power_on(node, check=False)
                text = row.pop("output")
                if args.keep_output:
                    keep(args.keep_output, f"{name.split()[0]}-{trial + 1}", text, row)
                row["steps_lost"] = steps_lost(text)
                row["losses"] = compare_losses(text, reference) if row["again"] == "yes" else "-"
                trials.append(row)
                print(f"trial {trial + 1} {name}: {row}", file=sys.stderr)
    table = []
    for name, trials in rows.items():
        row = {"launcher": name, "persist_every": args.persist_every}
        row.update({key: benchlib.median(t.get(key) for t in trials) for key in FIGURES})
        for key in ("again", "losses", "end"):
            row[key] = "; ".join(str(t.get(key, "-")) for t in trials)
        table.append(row)
    print(TABLE.render(table))
    print(f"{args.trials} trial(s); figures are medians, seconds from the power loss")
    if args.json:
        benchlib.write_json(args.json, {"scenario": "batch-node", "trials": rows, "table": table})
