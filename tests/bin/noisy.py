"""A script that knows nothing of ftrun and writes what real scripts write: 'step N' lines, then
(the first time, with --marker) a line of --long-mb MiB with no newline, a fast `\\r` progress bar
of --bar-kb KB, bytes that are not UTF-8 and --burst-mb MB of lines as fast as it can (a step
per MB); then more steps, then it hangs (sleeps) until killed. Once the marker exists it just
steps and exits."""

import argparse
import os
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--marker", required=True)
p.add_argument("--steps", type=int, default=10)
p.add_argument("--long-mb", type=float, default=2.0)
p.add_argument("--bar-kb", type=int, default=700)
p.add_argument("--burst-mb", type=int, default=0)
p.add_argument("--interval", type=float, default=0.05)
args = p.parse_args()
out = sys.stdout.buffer
first = not os.path.exists(args.marker)


def steps(start: int, count: int) -> int:
    for step in range(start, start + count):
        out.write(b"step %d\n" % step)
        out.flush()
        time.sleep(args.interval)
    return start + count


step = steps(1, args.steps)
if not first:
    sys.exit(0)
open(args.marker, "w").close()
# Phases apart by a few steps, so each reaches the agent on its own (the burst is skipped ahead).
out.write(b"LONG:" + b"x" * int(args.long_mb * (1 << 20)) + b":END\n")
step = steps(step, 3)
bar = 0
while bar * 70 < args.bar_kb * 1000:
    bar += 1
    out.write(b"\rprogress %6d |%s|" % (bar, b"#" * (bar % 50) + b"." * (50 - bar % 50)))
out.write(b"\rprogress done\n")
step = steps(step, 3)
out.write(b"bad bytes: \xff\xfe\xc3(\n")
step = steps(step, args.steps)
line = b"burst " + b"b" * 90 + b"\n"
for i in range(args.burst_mb * (1 << 20) // len(line)):
    out.write(line)
    if i % 10_000 == 0:  # still training, at 1 MB of output per step
        out.write(b"step %d\n" % step)
        step += 1
out.flush()
step = steps(step, args.steps)
out.write(b"AFTER THE BURST: hanging after step %d\n" % (step - 1))
out.flush()
time.sleep(3600)  # hung
