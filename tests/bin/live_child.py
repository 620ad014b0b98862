"""Trains tests/integration/ckpt_helpers.Toy with a snapshot after every step, in the memory
tier of --job, then dies by SIGKILL at step --steps + 1, at the point --die names:

  forward    after the forward and backward pass, before the optimizer step: the state is
             the saved step's, and the live snapshot (ftrun/checkpoint/live.py) holds it
  optimizer  as the optimizer step ends: the state has changed and is not saved
  replaced   like `forward`, but every parameter was given new storage two steps before
             the last (as `model.to()` does): the live snapshot must follow the parameters
  never      it trains on until the test kills it, at a moment the test does not choose;
             between a save and the next step it computes for ~20 ms more (the next batch's
             work), so a kill lands there as often as in the optimizer step or a save

Before dying it prints `SAVES <saves> <live saves>`. Nothing is persisted (the snapshot tier
alone is under test).
"""

import argparse
import os
import signal
import sys
import time

sys.path.insert(0, os.getcwd())  # the repository root: tests.integration.ckpt_helpers

import torch

import ftrun.checkpoint as ckpt
from tests.integration.ckpt_helpers import Toy


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def busy(seconds: float) -> None:
    a = torch.ones(256, 256)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        a = (a @ a).clamp_(-1, 1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--job", required=True)
    p.add_argument("--directory", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--full-copy-every", type=int, default=5)
    p.add_argument("--die", choices=["forward", "optimizer", "replaced", "never"], required=True)
    args = p.parse_args()
    toy = Toy(width=1280)  # over the live snapshot's minimum size
    mgr = ckpt.Manager(
        args.directory,
        job_id=args.job,
        persist_every=10**9,
        full_copy_every=args.full_copy_every,
        live_snapshot=True,
    )
    mgr.restore(toy.state)
    for step in range(1, args.steps + 1):
        if args.die == "replaced" and step == args.steps - 2:
            with torch.no_grad():
                for param in toy.model.parameters():
                    param.data = param.data.clone()
        toy.step()
        mgr.save(step, toy.state)
        if args.die == "never":
            busy(0.02)
            if step == 3:
                print("TRAINING", flush=True)
    print(f"SAVES {mgr.stats.saves} {mgr.stats.live_saves}", flush=True)
    if args.die == "optimizer":
        toy.opt.register_step_post_hook(lambda *_: die())
        toy.step()
    x = toy.loader.next()
    toy.model(x).sum().backward()
    die()


if __name__ == "__main__":
    main()
