"""The shape of pytorch/examples' distributed/ddp-tutorial-series/multigpu_torchrun.py, on CPU:
`TOTAL_EPOCHS SAVE_EVERY [--batch_size N]`, torchrun's environment, DDP on gloo, a snapshot in
the working directory that a restarted run resumes from. For the tutorials' torchrun command
lines run with `ftrun launch` in torchrun's place (tests/integration/test_torchrun_flags.py)."""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

SNAPSHOT = "snapshot.pt"


def main(total_epochs: int, save_every: int, batch_size: int) -> None:
    dist.init_process_group("gloo")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 20), torch.randn(64, 1))
    loader = DataLoader(data, batch_size=batch_size, sampler=DistributedSampler(data))
    model = torch.nn.Linear(20, 1)
    first = 0
    if os.path.exists(SNAPSHOT):
        snapshot = torch.load(SNAPSHOT)
        model.load_state_dict(snapshot["MODEL_STATE"])
        first = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {first}")
    model = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for epoch in range(first, total_epochs):
        loader.sampler.set_epoch(epoch)
        print(f"[CPU{local_rank}] Epoch {epoch} | Batchsize: {batch_size} | Steps: {len(loader)}")
        for source, targets in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(source), targets).backward()
            optimizer.step()
        if local_rank == 0 and epoch % save_every == 0:
            torch.save({"MODEL_STATE": model.module.state_dict(), "EPOCHS_RUN": epoch}, SNAPSHOT)
            print(f"Epoch {epoch} | Training snapshot saved at {SNAPSHOT}")
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("save_every", type=int)
    parser.add_argument("--batch_size", type=int, default=32)
    args = parser.parse_args()
    main(args.total_epochs, args.save_every, args.batch_size)
