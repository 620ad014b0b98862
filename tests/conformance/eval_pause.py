"""Rank 0 evaluates every few steps while the other ranks wait in barrier(): a periodic pause on
one rank, much longer than a step (the shape of every script that evaluates, logs or saves on
rank 0). Prints `step N` lines, for a launcher's progress regex."""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from _conf import maybe_die, say
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=12)
p.add_argument("--eval-every", type=int, default=5)
p.add_argument("--eval-s", type=float, default=3.5)
args = p.parse_args()


def evaluate(model: nn.Module, seconds: float) -> float:
    # Real work for a while: an evaluation's forward passes, timed so a busy machine does not
    # make it longer than asked.
    total, t0, x = 0.0, time.monotonic(), torch.randn(256, 256)
    with torch.no_grad():
        while time.monotonic() - t0 < seconds:
            x = torch.tanh(x @ x.T / 256)
            total += float(model.module(x[:, :8]).sum())
    return total


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, args.steps + 1):
        maybe_die(step)
        torch.manual_seed(step * 10 + rank)
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step}", flush=True)
        if step % args.eval_every == 0:
            if rank == 0:
                evaluate(model, args.eval_s)
            dist.barrier()
    say(f"weight sum {model.module.weight.detach().sum().item():.6f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
