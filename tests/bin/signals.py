"""A plain training loop (no ftrun import) with the signal handlers real scripts have:
SIGTERM → save (takes --save-s seconds), write `<dir>/saved-rank<R>`, exit 0;
SIGUSR1 → note it in `<dir>/usr1-rank<R>` and keep going, exiting 0 --after-usr1 steps later.
--late-rank R: that rank installs its handlers only once `<dir>/handlers-now` exists (a rank
still importing when a notice comes), and prints nothing before."""

import argparse
import os
import signal
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--dir", required=True)
p.add_argument("--save-s", type=float, default=0.0)
p.add_argument("--after-usr1", type=int, default=None)
p.add_argument("--interval", type=float, default=0.05)
p.add_argument("--late-rank", default=None)
args = p.parse_args()
rank = os.environ["RANK"]
if rank == args.late_rank:
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(args.dir, "handlers-now")):
        if time.monotonic() > deadline:
            sys.exit("handlers-now never came")
        time.sleep(0.05)
got: list[str] = []
signal.signal(signal.SIGTERM, lambda s, f: got.append("TERM"))
signal.signal(signal.SIGUSR1, lambda s, f: got.append("USR1"))

step, usr1_at = 0, None
while True:
    step += 1
    print(f"step {step}", flush=True)
    if "TERM" in got:
        time.sleep(args.save_s)  # the checkpoint a preempted job writes
        with open(os.path.join(args.dir, f"saved-rank{rank}"), "w") as f:
            f.write(str(step))
        print(f"saved at step {step} after SIGTERM", flush=True)
        sys.exit(0)
    if "USR1" in got and usr1_at is None:
        usr1_at = step
        with open(os.path.join(args.dir, f"usr1-rank{rank}"), "w") as f:
            f.write(str(step))
        print(f"got SIGUSR1 at step {step}", flush=True)
    if usr1_at is not None and args.after_usr1 is not None and step >= usr1_at + args.after_usr1:
        sys.exit(0)
    time.sleep(args.interval)
