"""A small GPT-style language model trained with DDP (gloo on CPU, NCCL on GPUs).

Runs unchanged under plain torchrun; under `ftrun launch` it also reports step progress
(`ftrun.step`), and its checkpoints go to the job directory. It checkpoints every --ckpt-every
steps (model, optimizer, step, RNG) and resumes from the newest one, so a restarted run continues
where the checkpoint left off.

    ftrun launch --nproc-per-node 2 recipes/gpt_ddp.py --steps 200
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import ftrun


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.size(1)
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), 1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, context: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(layers)))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.size(1), device=idx.device)
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos(pos))))


def corpus(length: int, vocab: int) -> torch.Tensor:
    """A deterministic synthetic token stream with structure a model can learn."""
    g = torch.Generator().manual_seed(1234)
    base = torch.randint(0, vocab, (97,), generator=g)
    steps = torch.arange(length)
    return (base[steps % 97] + steps // 97) % vocab


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=8, help="per-rank micro-batch")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--ckpt-dir", default=None,
                   help="default: <ftrun job dir>/checkpoints, or ./checkpoints outside ftrun")
    args = p.parse_args()

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}" if backend == "nccl" else "cpu")
    torch.manual_seed(0)
    vocab = 256
    model = GPT(vocab, args.dim, args.layers, heads=4, context=args.context).to(device)
    model = DistributedDataParallel(model, device_ids=[device] if backend == "nccl" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data = corpus(200_000, vocab)

    ckpt_dir = args.ckpt_dir or os.path.join(os.environ.get("FTRUN_JOB_DIR", "."), "checkpoints")
    ckpt = os.path.join(ckpt_dir, "gpt.pt")
    start = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt, map_location=device, weights_only=False)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
        if rank == 0:
            print(f"resumed from step {start}", flush=True)

    for step in range(start + 1, args.steps + 1):
        t0 = time.perf_counter()
        # The batch is a pure function of (step, rank): a resumed run sees the same data.
        g = torch.Generator().manual_seed(step * world + rank)
        starts = torch.randint(0, len(data) - args.context - 1, (args.batch,), generator=g)
        x = torch.stack([data[s:s + args.context] for s in starts]).to(device)
        y = torch.stack([data[s + 1:s + args.context + 1] for s in starts]).to(device)
        loss = F.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        ftrun.step(step)
        if rank == 0 and (step % 10 == 0 or step == start + 1):
            print(f"step {step} loss {loss.item():.4f} ppl {math.exp(loss.item()):.1f} "
                  f"({(time.perf_counter() - t0) * 1000:.0f} ms)", flush=True)
        if step % args.ckpt_every == 0:
            if rank == 0:
                os.makedirs(ckpt_dir, exist_ok=True)
                torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                            "step": step}, ckpt + ".tmp")
                os.replace(ckpt + ".tmp", ckpt)  # never leave a torn checkpoint behind
            dist.barrier()

    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(f"finished {args.steps} steps", flush=True)
    # torch 2.13 + gloo: a DDP process sometimes aborts in interpreter teardown ("terminate called
    # without an active exception"); nothing is left to do, so skip the teardown.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
