"""Uneven work that is no straggler: every --eval-every steps rank 0 computes for --eval-s
seconds (an evaluation, not declared as a section) while the other ranks wait in barrier(), as
tests/conformance/eval_pause.py does, but with steps of --step-work matmuls reported by
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
p.add_argument("--step-work", type=int, default=400, help="matmuls a step (~10 ms of CPU)")
args = p.parse_args()


def work(n: int) -> None:
    """A step's compute: the same work on every rank, however busy the machine."""
    x = torch.randn(64, 64)
    for _ in range(n):
        x = torch.tanh(x @ x.T / 64)


def busy(seconds: float) -> None:
    """An evaluation: timed, so a busy machine does not make it longer than asked."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        work(10)


dist.init_process_group("gloo")
rank = dist.get_rank()
grad = torch.zeros(1024)
for step in range(1, args.steps + 1):
    work(args.step_work)
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
