"""A host's ranks renumbered: generation 1 trains as 2 ranks (under torchrun), generation 2 as
one plain process, rank 0 of a world of 1, on the same host memory tier.

    python -m torch.distributed.run --nproc-per-node 2 ckpt_stale.py --dir D --job J --gen 1
    python ckpt_stale.py --dir D --job J --gen 2

Each generation restores, saves --steps more steps (persisting each) and closes. Prints
`RESTORED <step> <tier>` and `STALE RANKS REMOVED <n>` per rank.
"""

import argparse
import os

import torch
import torch.distributed as dist

import ftrun.checkpoint as ckpt


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--gen", type=int, required=True)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = {"train": ckpt.TrainState(model, opt)}
    mgr = ckpt.Manager(
        args.dir,
        job_id=args.job,
        generation=args.gen,
        persist_interval=0,
        persist_bandwidth=0,
    )
    start = mgr.restore(state)
    print(f"RESTORED {start} {mgr.restored.tier}", flush=True)
    for step in range(start + 1, start + 1 + args.steps):
        model(torch.randn(8, 64)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        mgr.save(step, state)
        assert mgr.wait_persist(60), "a persist did not finish"
    mgr.close()
    print(f"STALE RANKS REMOVED {mgr.stats.stale_ranks_removed}", flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
