"""Training throughput with a snapshot every step, and where the loss goes.

    python scripts/bench_throughput.py [--state-gib 1 4.5] [--rounds 4]

One process, one rank, the model of scripts/bench_ckpt.py (bias-free Linear layers, AdamW),
at each --state-gib. For each ftrun variant, windows of --steps steps with a snapshot after
every step alternate with windows without checkpoints (the machine is shared: a ratio is only
meaningful next to its own baseline). Each variant is one cost added to the one before:

  snapshot only              the snapshot into the memory tier, nothing persisted: every save
                             is a full copy into a slot (the default)
  snapshot only, live snapshot
                             live_snapshot=True: the live snapshot (ftrun/checkpoint/live.py)
                             commits the state where it lives, with a full copy into a slot as
                             often as 2 % of the time pays (opt-in since issue 33)
  + persist, a quarter of the time
                             the defaults: a persist starts no sooner than 4 times the last one's
                             duration after it (persist_interval=None), written at
                             persist_bandwidth (200 MB/s) by a worker at nice 10
  + persist when free        persist_interval=0: a persist starts whenever the worker is free,
                             so storage is written all the time (the default before 2026-11-26)
  + persist when free, idle  the same with the worker at SCHED_IDLE

The process runs under the glibc tunables ftrun's agent gives the ranks it starts
(ftrun/agent/copy_tunables.py: copies of 4 MiB or more with non-temporal stores where glibc's own
threshold is higher), re-executing itself if need be; --glibc-default measures glibc's own
choice instead.

Reported per size and variant: steps/s relative to none (all windows' time, the median of the
rounds' ratios, and their min-max: on a shared VM single windows swing by 10 % and more), the
time the optimizer step was held for the copy, save() and its whole copy with nothing else
running ("copy alone") and the ratio that leaves when none of the copy hides in idle time
("no overlap": step / (step + copy alone), the bound a copy at the machine's memory bandwidth
sets while training keeps every core busy), and how many snapshots reached storage. Target (DESIGN.md §9): ≥ 0.95 with a snapshot every step.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import benchlib
import torch
from bench_ckpt import Ftrun, Loop, build, timed_window
from benchlib import Column, Table

import ftrun.checkpoint as ckpt

VARIANTS = {
    "snapshot only": {"persist_every": 10**9},
    "snapshot only, live snapshot": {"persist_every": 10**9, "live_snapshot": True},
    "+ persist, a quarter of the time": {},  # the defaults
    "+ persist when free": {"persist_interval": 0},
    "+ persist when free, idle": {"persist_interval": 0, "persist_priority": "idle"},
}


class Variant(Ftrun):
    def __init__(self, root: Path, model, opt, *, options: dict) -> None:
        self.options = options
        super().__init__(root, model, opt)

    def make_manager(self) -> ckpt.Manager:
        return ckpt.Manager(self.root, job_id=self.job, keep=2, **self.options)


def owned_window(loop: Loop, method: Variant, steps: int, first: int) -> float:
    """Seconds/step of `steps` steps with a snapshot after each, the last snapshot's copy
    included: left to run on, it would be paid by the first optimizer step of the next
    baseline window (the hook stays attached), which made earlier runs read 1-2 points high.
    A persist still running goes on into the next window, as in training."""
    t0 = time.perf_counter()
    timed_window(loop, method, steps, 1, first, None, drain=False)
    method.settle()
    return (time.perf_counter() - t0) / steps


def copy_alone(method: Variant, first: int, times: int = 3) -> float:
    """Seconds of save() plus its whole copy with nothing else running (the training thread
    joins the snapshot thread, as in the optimizer hook), the median of `times`. With training
    on both cores and none of the copy hidden in idle time, a snapshot every step keeps
    step / (step + this) of the throughput: the "no overlap" column, what a copy at the machine's
    memory bandwidth allows, next to which the measured ratio is read."""
    seconds = []
    for i in range(times):
        t0 = time.perf_counter()
        method.save(first + i)
        method.settle()
        seconds.append(time.perf_counter() - t0)
    return statistics.median(seconds)


def measure(args: argparse.Namespace, state_gib: float, root: Path) -> list[dict]:
    model, opt, layers = build(state_gib)
    loop = Loop(model, opt, args.batch)
    loop.step()  # allocate optimizer state
    gib = sum(p.numel() for p in model.parameters()) * 12 / 2**30
    rows = []
    for name, options in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        method = Variant(root / name.replace(" ", "_"), model, opt, options=options)
        base, every, held = [], [], 0.0
        try:
            method.save(0)
            method.settle()
            method.drain()
            method.ready()
            start_blocked = method.mgr.stats.blocked_s
            for r in range(args.rounds):
                base.append(timed_window(loop, None, args.steps, 1, 0, None, drain=False))
                every.append(owned_window(loop, method, args.steps, 1 + 1000 * r))
            held = method.mgr.stats.blocked_s - start_blocked
            base.append(timed_window(loop, None, args.steps, 1, 0, None, drain=False))
            stats = method.mgr.stats
            note = f"{stats.persisted} of {stats.saves} persisted, {stats.live_saves} live"
            method.drain()
            alone = copy_alone(method, 10**6)
        finally:
            method.close()
        ratios = [b / e for b, e in zip(base, every, strict=False)]
        rows.append(
            {
                "size": f"{gib:.2f} GiB",
                "variant": name,
                "thru": statistics.mean(base) / statistics.mean(every),
                "median": statistics.median(ratios),
                "spread": f"{min(ratios):.3f}-{max(ratios):.3f}",
                "held_ms": 1000 * held / (args.rounds * args.steps),
                "alone_ms": 1000 * alone,
                "no_overlap": statistics.mean(base) / (statistics.mean(base) + alone),
                "step_s": statistics.mean(base),
                "note": note,
            }
        )
        print(f"  {gib:.2f} GiB {name}: {rows[-1]}", flush=True)
    del model, opt, loop
    return rows


TABLE = Table(
    [
        Column(key="size", header="state", align="<"),
        Column(key="variant", header="variant", align="<"),
        Column(key="step_s", header="step s (none)", spec=".2f"),
        Column(key="thru", header="thru vs none", spec=".3f"),
        Column(key="median", header="median round", spec=".3f"),
        Column(key="spread", header="rounds", align="<"),
        Column(key="held_ms", header="opt.step held ms", spec=".1f"),
        Column(key="alone_ms", header="copy alone ms", spec=".1f"),
        Column(key="no_overlap", header="no overlap", spec=".3f"),
        Column(key="note", header="snapshots", align="<"),
    ],
    name="variant",
    anchor="none",
)


def main() -> None:
    benchlib.exit_on_sigterm()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--state-gib", type=float, nargs="+", default=[1.0, 4.5])
    p.add_argument("--batch", type=int, default=256, help="rows per step (sets the step time)")
    p.add_argument("--steps", type=int, default=4, help="steps per window")
    p.add_argument("--rounds", type=int, default=4, help="windows of each kind per variant")
    p.add_argument(
        "--only", nargs="+", choices=list(VARIANTS), default=None, help="run these variants"
    )
    p.add_argument("--json", default=None, help="also write the rows to this file")
    benchlib.add_glibc_default_flag(p)
    args = p.parse_args()
    benchlib.start_as_ranks_do(args)
    print(
        f"{torch.get_num_threads()} threads; {args.rounds} rounds of {args.steps} steps; "
        f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r}"
    )
    root = Path(tempfile.mkdtemp(prefix="bench_throughput."))
    t0 = time.monotonic()
    try:
        rows = [row for gib in args.state_gib for row in measure(args, gib, root)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print()
    print(TABLE.render([{"variant": "none", "thru": 1.0}, *rows]))
    print(f"({time.monotonic() - t0:.0f} s)")
    if args.json:
        benchlib.write_json(args.json, {"rows": rows})


if __name__ == "__main__":
    main()
