"""Reports a step every --interval seconds until killed; --ignore-sigterm makes it stubborn.
Writes its pid to --pid-dir so a test can check it died."""

import argparse
import os
import signal
import time

import ftrun

p = argparse.ArgumentParser()
p.add_argument("--interval", type=float, default=0.05)
p.add_argument("--ignore-sigterm", action="store_true")
p.add_argument("--pid-dir", default=None)
args = p.parse_args()
if args.ignore_sigterm:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if args.pid_dir:
    with open(os.path.join(args.pid_dir, f"rank{os.environ.get('RANK')}.pid"), "w") as f:
        f.write(str(os.getpid()))
print(f"agent socket {os.environ.get('FTRUN_AGENT_SOCK')}", flush=True)
step = 0
while True:
    step += 1
    ftrun.step(step)
    print(f"step {step}", flush=True)
    time.sleep(args.interval)
