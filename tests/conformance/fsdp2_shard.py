"""FSDP2 (`fully_shard`) on gloo and CPU: a few steps, then the full weights gathered."""

import torch
import torch.distributed as dist
import torch.nn as nn
from _conf import maybe_die, say
from torch.distributed.fsdp import fully_shard


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        maybe_die(step)
        torch.manual_seed(step * 10 + rank)
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    total = sum(p.full_tensor().sum().item() for p in model.parameters())
    say(f"param sum {total:.5f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
