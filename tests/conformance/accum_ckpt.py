"""Gradient accumulation under DDP (no_sync for all but the last micro-batch), a slow first
few steps (data loading warming up, a first compilation), and a checkpoint on rank 0 every few
steps that takes about ten steps' time while the others go on to the next all-reduce and wait
there. Prints `step N` lines, for a launcher's progress regex."""

import argparse
import contextlib
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from _conf import DIR, maybe_die, say
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=16)
p.add_argument("--accum", type=int, default=4)
p.add_argument("--slow-steps", type=int, default=3)
p.add_argument("--slow-s", type=float, default=1.0)
p.add_argument("--ckpt-every", type=int, default=6)
args = p.parse_args()


def busy(seconds: float) -> None:
    t0, x = time.monotonic(), torch.randn(128, 128)
    while time.monotonic() - t0 < seconds:
        x = torch.tanh(x @ x)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step_s = []
    for step in range(1, args.steps + 1):
        maybe_die(step)
        t0 = time.monotonic()
        if step <= args.slow_steps:
            busy(args.slow_s)  # the first steps: a cold data pipeline, a first compile
        optimizer.zero_grad()
        for micro in range(args.accum):
            torch.manual_seed(step * 100 + micro * 10 + rank)
            sync = micro == args.accum - 1
            with contextlib.nullcontext() if sync else model.no_sync():
                loss = model(torch.randn(8, 16)).pow(2).mean() / args.accum
                loss.backward()
        optimizer.step()
        step_s.append(time.monotonic() - t0)
        print(f"step {step}", flush=True)
        if step % args.ckpt_every == 0 and rank == 0:
            # A checkpoint about ten steps long, on rank 0 only (the others wait for it in the
            # next step's all-reduce).
            t_end = time.monotonic() + 10 * max(0.05, min(step_s[args.slow_steps :] or [0.05]))
            while time.monotonic() < t_end:
                torch.save(model.module.state_dict(), os.path.join(DIR, "ckpt.pt"))
    say(f"weight sum {sum(p.detach().sum().item() for p in model.parameters()):.6f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
