"""Does its work (a few all-reduces on gloo, reporting nothing to ftrun), then rank 0 exits 0
and the other ranks do not exit: --then hang (threading.Event().wait(), forever), or
--then fail: wait until the controller has seen rank 0 exit 0 (the job's journal says
`exit_barrier`, within 60 s) and exit with code 3, a failure after the work was done."""

import argparse
import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--then", choices=["hang", "fail"], default="hang")
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4)
for _ in range(3):
    dist.all_reduce(t)
print(f"work done {t.tolist()}", flush=True)
if rank == 0:
    # Not sys.exit: a cold-started gloo process sometimes aborts in C++ static teardown
    # (docs/architecture.md), which would make this a crash, not a clean exit.
    sys.stdout.flush()
    os._exit(0)


def barrier_started() -> bool:
    try:
        with open(os.path.join(os.environ["FTRUN_JOB_DIR"], "events.jsonl")) as f:
            return any(json.loads(line).get("kind") == "exit_barrier" for line in f if line.strip())
    except (OSError, ValueError):
        return False


if args.then == "hang":
    threading.Event().wait()
deadline = time.monotonic() + 60
while not barrier_started() and time.monotonic() < deadline:
    time.sleep(0.05)
print("failing after rank 0 exited 0", flush=True)
sys.exit(3)
