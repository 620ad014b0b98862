"""A small GPT trained under any DP x PP layout with ftrun.parallel (gloo on CPU, NCCL on GPUs).

The model's top-level children are its pipeline units: `tok` (token + position embedding),
`block0` ... `block{N-1}`, `head` (final norm + output projection). Under `ftrun launch` the
controller's plan (FTRUN_PLAN) says which ranks hold which blocks and how micro-batches flow;
under plain torchrun or python there is no plan and every rank is a DDP replica. The data is
synthetic and indexed by global sample (sample i is the same on every rank, in every run), and
step s trains on global samples [s*B, (s+1)*B): the loss curve does not depend on the layout, and
a run resumed under another layout continues with the next sample.

Checkpoints with ftrun.checkpoint: a snapshot after every step (--ckpt-every), by parameter name,
so a checkpoint saved under one layout restores under another. The data position is the step.

    python recipes/gpt_pipeline.py --steps 20                         # one process
    torchrun --standalone --nproc-per-node 2 recipes/gpt_pipeline.py  # DP = 2
    ftrun profile recipes/gpt_pipeline.py --layers 8                  # profile.json for ftrun plan
    ftrun launch --nproc-per-node 4 recipes/gpt_pipeline.py --memory-budget 64MiB
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import ftrun
import ftrun.checkpoint as ckpt
from ftrun.errors import FtrunError
from ftrun.parallel import Parallel


class Embed(nn.Module):
    def __init__(self, vocab: int, dim: int, context: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tok(idx) + self.pos(torch.arange(idx.size(1), device=idx.device))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)  # dropout 0: deterministic
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.size(1)
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), 1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    def __init__(self, dim: int, vocab: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


class GPT(nn.Module):
    """Layers are top-level children, in forward order: the forward runs them one after another."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int, context: int) -> None:
        super().__init__()
        self.tok = Embed(vocab, dim, context)
        for i in range(layers):
            self.add_module(f"block{i}", Block(dim, heads))
        self.head = Head(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = idx
        for layer in self.children():
            x = layer(x)
        return x


class Corpus:
    """A deterministic synthetic token stream; sample i is a window drawn from a generator
    seeded by (seed, i), so any rank of any layout builds the same sample i."""

    def __init__(self, vocab: int, context: int, seed: int, length: int = 200_000) -> None:
        g = torch.Generator().manual_seed(1234)
        base = torch.randint(0, vocab, (97,), generator=g)
        steps = torch.arange(length)
        self.data = (base[steps % 97] + steps // 97) % vocab
        self.context, self.seed = context, seed

    def samples(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ys = [], []
        for i in range(start, start + count):
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
            s = int(torch.randint(0, len(self.data) - self.context - 1, (1,), generator=g))
            xs.append(self.data[s : s + self.context])
            ys.append(self.data[s + 1 : s + self.context + 1])
        return torch.stack(xs), torch.stack(ys)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--global-batch", type=int, default=16, help="samples per step, all ranks")
    p.add_argument("--micro-batch", type=int, default=2, help="samples per micro-batch (no plan)")
    p.add_argument("--layers", type=int, default=4, help="transformer blocks")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=32)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0, help="initial weights and data")
    p.add_argument("--memory-budget", default=None, help="per device, e.g. 64MiB")
    p.add_argument("--ckpt-every", type=int, default=1, help="snapshot every N steps (0: never)")
    p.add_argument(
        "--ckpt-dir",
        default=None,
        help="default: <ftrun job dir>/checkpoints, or ./checkpoints outside ftrun",
    )
    args = p.parse_args()

    torch.manual_seed(args.seed)  # the same full model on every rank, then each keeps its part
    model = GPT(args.vocab, args.dim, args.layers, args.heads, args.context)
    corpus = Corpus(args.vocab, args.context, args.seed)

    def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))

    run = Parallel(
        model,
        loss_fn=lm_loss,
        samples=corpus.samples,
        global_batch=args.global_batch,
        micro_batch=args.micro_batch,
        memory_budget=args.memory_budget,
    )
    del model  # the rank keeps only its layers: run.module
    opt = torch.optim.AdamW(run.module.parameters(), lr=args.lr)
    plan, rank = run.plan, run.rank
    if rank == 0:
        print(
            f"plan dp {plan.dp} x pp {plan.pp} {plan.schedule}, micro-batches "
            f"{plan.micro_batches} x {plan.micro_batch}, stages {list(plan.stages)}",
            flush=True,
        )

    # The data position is the global sample count, the same on every rank: not PerRank state.
    data = {"samples": 0, "global_batch": args.global_batch}
    state = {"train": ckpt.TrainState(run.module, opt), "data": data}
    mgr = ckpt.Manager(args.ckpt_dir)
    start = mgr.restore(state)  # every run calls it: 0 and nothing loaded when there is none
    if data["samples"] != start * args.global_batch:
        raise SystemExit(
            f"checkpoint of step {start} has {data['samples']} samples, not "
            f"{start} x --global-batch {args.global_batch}: keep the global batch"
        )
    if rank == 0 and start:
        print(f"resumed from step {start} ({mgr.restored.tier})", flush=True)

    for step in range(start + 1, args.steps + 1):
        t0 = time.perf_counter()
        loss = run.step(opt, batch=step - 1)  # global samples [(step-1)*B, step*B)
        data["samples"] = step * args.global_batch
        ftrun.step(step)
        if args.ckpt_every and step % args.ckpt_every == 0:
            mgr.save(step, state)  # returns at once; the copy overlaps the next step
        if rank == 0:
            print(
                f"step {step} loss {loss:.8f} ({(time.perf_counter() - t0) * 1000:.0f} ms)",
                flush=True,
            )

    mgr.close()  # persists the last snapshot if the background persist had not reached it
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        print(f"finished {args.steps} steps", flush=True)
    # torch 2.13 + gloo: a DDP process sometimes aborts in interpreter teardown ("terminate called
    # without an active exception"); nothing is left to do, so skip the teardown.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    try:
        main()
    except FtrunError as e:  # a plan or budget this run cannot use: the message, not a traceback
        print(f"error: {e.message}" + (f"\nhint: {e.hint}" if e.hint else ""), file=sys.stderr)
        sys.exit(e.exit_code)
