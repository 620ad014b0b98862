"""A script that knows nothing of ftrun: prints 'step N' and, with --stop-at N (once, with a
marker file), freezes itself with SIGSTOP, the way a rank stuck in a driver call looks. With
--print-rank R only rank R prints, as scripts that log from rank 0 alone do. With --stop-file F
it ends (exit 0) at the first step after F exists: a test that only needs the job running until
it has done its part ends it then, instead of waiting out a step count sized for a slow day."""

import argparse
import os
import signal
import time

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--stop-at", type=int, default=None)
p.add_argument("--marker", default=None)
p.add_argument("--interval", type=float, default=0.02)
p.add_argument("--pre-sleep", type=float, default=0.0, help="seconds before the first step")
p.add_argument("--print-rank", type=int, default=None)
p.add_argument("--stop-file", default=None)
args = p.parse_args()
prints = args.print_rank is None or os.environ.get("RANK") == str(args.print_rank)
time.sleep(args.pre_sleep)
for step in range(1, args.steps + 1):
    if step == args.stop_at and os.environ.get("RANK") == "0" and not os.path.exists(args.marker):
        open(args.marker, "w").close()
        os.kill(os.getpid(), signal.SIGSTOP)
    if args.stop_file and os.path.exists(args.stop_file):
        break
    if prints:
        print(f"step {step}", flush=True)
    time.sleep(args.interval)
