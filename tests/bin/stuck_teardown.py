"""Trains a few steps (printing `step N`), then every rank gets stuck in its teardown: a
function named as torch's own teardown, waiting for an event that never comes. A launcher must
not take that for a hang to restart for: the work is done."""

import argparse
import threading
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=10)
args = p.parse_args()


def destroy_process_group() -> None:
    dist.barrier()
    threading.Event().wait()  # as a gloo destructor that waits for a thread that never ends


dist.init_process_group("gloo")
t = torch.ones(4)
for step in range(1, args.steps + 1):
    dist.all_reduce(t)
    print(f"step {step}", flush=True)
    time.sleep(0.1)  # steps the launcher sees one by one (a rhythm to judge by)
destroy_process_group()
