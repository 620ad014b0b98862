"""A small GPT-style language model trained with DDP (gloo on CPU, NCCL on GPUs).

Checkpoints with `ftrun.checkpoint`: a snapshot after every step (--ckpt-every), taken in the
background while the next step runs, persisted to storage whenever the previous persist is done.
The state is the model and optimizer (by parameter name), each rank's data position and
generator, and the RNG states (saved automatically), so a resumed run continues the same stream.

- under `ftrun launch`, checkpoints go to the job directory and snapshots also stay in host
  memory (/dev/shm), so a restart in place restores from memory, not from disk;
- under plain torchrun (or python), it runs unchanged: checkpoints go to ./checkpoints (or
  --ckpt-dir) and a new run resumes from the newest valid one there.

    ftrun launch --nproc-per-node 2 recipes/gpt_ddp.py --steps 200
    torchrun --standalone --nproc-per-node 2 recipes/gpt_ddp.py --steps 200
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
import ftrun.checkpoint as ckpt


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(
            nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(0.1)
        )  # draws from the RNG: it is in the checkpoint

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


class Batches:
    """Random windows of the corpus, drawn from this rank's own generator. Its position and
    generator are checkpoint state, so a resumed run draws the batches it would have drawn."""

    def __init__(self, data: torch.Tensor, batch: int, context: int, seed: int) -> None:
        self.data, self.batch, self.context = data, batch, context
        self.generator = torch.Generator().manual_seed(seed)
        self.position = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.position += 1
        starts = torch.randint(
            0, len(self.data) - self.context - 1, (self.batch,), generator=self.generator
        )
        x = torch.stack([self.data[s : s + self.context] for s in starts])
        y = torch.stack([self.data[s + 1 : s + self.context + 1] for s in starts])
        return x, y

    def state_dict(self) -> dict:
        return {"position": self.position, "generator": self.generator.get_state()}

    def load_state_dict(self, sd: dict) -> None:
        self.position = sd["position"]
        self.generator.set_state(sd["generator"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=8, help="per-rank micro-batch")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--ckpt-every", type=int, default=1, help="snapshot every N steps")
    p.add_argument(
        "--min-step-time",
        type=float,
        default=0.0,
        help="seconds a step takes at least: a bigger model's pace, where a demo or a test on a "
        "small machine shares its cores with other work",
    )
    p.add_argument(
        "--ckpt-dir",
        default=None,
        help="default: <ftrun job dir>/checkpoints, or ./checkpoints outside ftrun",
    )
    args = p.parse_args()

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank = dist.get_rank()
    device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}" if backend == "nccl" else "cpu")
    torch.manual_seed(0)
    vocab = 256
    net = GPT(vocab, args.dim, args.layers, heads=4, context=args.context).to(device)
    model = DistributedDataParallel(net, device_ids=[device] if backend == "nccl" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    batches = Batches(corpus(200_000, vocab), args.batch, args.context, seed=1000 + rank)

    state = {"train": ckpt.TrainState(net, opt), "data": ckpt.PerRank(batches)}
    mgr = ckpt.Manager(args.ckpt_dir)
    start = mgr.restore(state)  # every run calls it: 0 and nothing loaded when there is none
    if rank == 0 and start:
        print(f"resumed from step {start} ({mgr.restored.tier})", flush=True)

    for step in range(start + 1, args.steps + 1):
        t0 = time.perf_counter()
        x, y = (t.to(device) for t in batches.next())
        loss = F.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()  # first waits, if needed, for the previous snapshot's copy
        ftrun.step(step)
        if step % args.ckpt_every == 0:
            mgr.save(step, state)  # returns at once; the copy overlaps the next step
        if (spare := args.min_step_time - (time.perf_counter() - t0)) > 0:
            time.sleep(spare)
        if rank == 0 and (step % 10 == 0 or step == start + 1):
            print(
                f"step {step} loss {loss.item():.4f} ppl {math.exp(loss.item()):.1f} "
                f"({(time.perf_counter() - t0) * 1000:.0f} ms)",
                flush=True,
            )

    mgr.close()  # persists the last snapshot if the background persist had not reached it
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
