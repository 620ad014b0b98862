"""A script that prints nothing while it runs.
--mode sleep: every rank says `ready`, then sits silently, forever (no progress signal).
--mode spin: rank 0 burns CPU for --seconds without a word while the others sleep silently a
second longer; then each exits 0.
--mode section: every rank sleeps silently for --seconds inside `ftrun.section`, then exits 0.
--mode steps: every rank calls `ftrun.step` every 1.5 s for --seconds, silently, then exits 0."""

import argparse
import os
import time

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["sleep", "spin", "section", "steps"], default="sleep")
p.add_argument("--seconds", type=float, default=5.0)
args = p.parse_args()
rank = int(os.environ.get("RANK", "0"))
print(f"ready rank {rank}", flush=True)
if args.mode == "sleep":
    while True:
        time.sleep(3600)
elif args.mode == "spin":
    if rank == 0:
        end, x = time.monotonic() + args.seconds, 0
        while time.monotonic() < end:
            x += sum(i * i for i in range(10_000))
    else:
        time.sleep(args.seconds + 1)
elif args.mode == "section":
    import ftrun

    with ftrun.section("load", timeout_s=None):
        time.sleep(args.seconds)
else:
    import ftrun

    end, step = time.monotonic() + args.seconds, 0
    while time.monotonic() < end:
        step += 1
        ftrun.step(step)
        time.sleep(1.5)
print(f"done rank {rank}", flush=True)
