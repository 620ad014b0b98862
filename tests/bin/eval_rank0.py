"""Uneven work that is no straggler: every --eval-every steps rank 0 computes for --eval-s
seconds (an evaluation, not declared as a section) while the other ranks wait in barrier(), as
tests/conformance/eval_pause.py does, but with steps of --step-ms of compute reported by
ftrun.step (the agent reads each rank's counts at each one) and printed as `step N`."""

import argparse
import time

import torch
import torch.distributed as dist

import ftrun

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--eval-every", type=int, default=5)
p.add_argument("--eval-s", type=float, default=1.5)
p.add_argument("--step-ms", type=float, default=10.0)
args = p.parse_args()


def busy(seconds: float) -> None:
    t0, x = time.monotonic(), torch.randn(64, 64)
    while time.monotonic() - t0 < seconds:
        x = torch.tanh(x @ x.T / 64)


dist.init_process_group("gloo")
rank = dist.get_rank()
grad = torch.zeros(1024)
for step in range(1, args.steps + 1):
    busy(args.step_ms / 1000)
    dist.all_reduce(grad)
    ftrun.step(step)
    print(f"step {step}", flush=True)
    if step % args.eval_every == 0:
        if rank == 0:
            busy(args.eval_s)
        dist.barrier()
dist.barrier()
dist.destroy_process_group()
print(f"done rank {rank}", flush=True)
