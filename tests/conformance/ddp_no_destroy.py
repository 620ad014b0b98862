"""DDP on gloo as people write it: argparse, a __main__ guard, the model and optimizer as
globals of the guard, a checkpoint it resumes from, and no destroy_process_group() at the end."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from _conf import DIR, maybe_die, say
from torch.nn.parallel import DistributedDataParallel as DDP

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    path = os.path.join(DIR, "ckpt.pt")
    start = 0
    if os.path.exists(path):
        state = torch.load(path)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"] + 1
        say("resumed at", start)
    for step in range(start, args.steps):
        maybe_die(step)
        torch.manual_seed(1000 + step * 10 + rank)
        x = torch.randn(8, 16)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        say(f"step {step} loss {loss.item():.6f}")
        if rank == 0:
            torch.save(
                {
                    "model": model.module.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "step": step,
                },
                path + ".tmp",
            )
            os.replace(path + ".tmp", path)
        dist.barrier()  # every rank passes a step only once its checkpoint is on disk
    say("done")
