"""DDP on gloo inside main(), ending with destroy_process_group()."""

import torch
import torch.distributed as dist
import torch.nn as nn
from _conf import maybe_die, say
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(10):
        maybe_die(step)
        torch.manual_seed(step * 10 + rank)
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    weight = model.module.weight.detach().sum().item()
    say(f"weight sum {weight:.6f} world {dist.get_world_size()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
