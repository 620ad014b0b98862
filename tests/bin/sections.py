"""Steps, then a declared section that takes --section-s seconds, then more steps."""

import argparse
import time

import ftrun

p = argparse.ArgumentParser()
p.add_argument("--section-s", type=float, default=3.0)
p.add_argument("--section-timeout", type=float, default=30.0)
args = p.parse_args()
for step in range(1, 11):
    time.sleep(0.02)
    ftrun.step(step)
with ftrun.section("checkpoint", timeout_s=args.section_timeout):
    time.sleep(args.section_s)
for step in range(11, 21):
    time.sleep(0.02)
    ftrun.step(step)
print("sections done", flush=True)
