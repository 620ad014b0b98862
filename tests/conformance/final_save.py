"""After the last step, rank 0 saves for a while (several full state dicts) while the other
ranks wait in barrier(), then every rank destroys the process group: the end of most training
scripts. Prints `step N` lines, for a launcher's progress regex."""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from _conf import DIR, maybe_die, say
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=12)
p.add_argument("--save-s", type=float, default=4.0)
args = p.parse_args()


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
    if rank == 0:
        # A final save that takes a while: a big state written again and again, as a script
        # that saves every shard or several formats would.
        big = {"w": torch.randn(512, 512), "model": model.module.state_dict()}
        t0, n = time.monotonic(), 0
        while time.monotonic() - t0 < args.save_s:
            torch.save(big, os.path.join(DIR, "final.pt"))
            n += 1
        say(f"saved {n > 0}")
    dist.barrier()
    say(f"weight sum {model.module.weight.detach().sum().item():.6f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
