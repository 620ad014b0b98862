"""A DataLoader with worker processes (forked from the rank), under DDP."""

import torch
import torch.distributed as dist
from _conf import maybe_die, say
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Squares(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i * i)])


def main() -> None:
    dist.init_process_group("gloo")
    loader = DataLoader(
        Squares(), batch_size=8, num_workers=2, sampler=DistributedSampler(Squares(), shuffle=False)
    )
    total = torch.zeros(1)
    for step, batch in enumerate(loader):
        maybe_die(step)
        total += batch.sum()
    dist.all_reduce(total)
    say("total", int(total.item()))


if __name__ == "__main__":
    main()
