"""Trains a shape of tests/integration/live_shapes.py with a save after every step, in the memory
tier of --job, for --steps steps, then dies by SIGKILL at the moment --die names:

  forward     in step --steps + 1: what the shape does between the save and the optimizer
              step (SAM's first pass, a hand-written update), then a forward pass, then the
              kill; the EMA shapes are killed in the evaluation's forward pass, the EMA's
              weights swapped in
  after-save  as save() of step --steps returns (before any forward pass)
  save        inside save() of step --steps, as the snapshot's manifest is about to be written

Before dying it prints `SAVES <saves> <live saves>`. Nothing is persisted (the memory tier
alone is under test). --live: pass live_snapshot=True (else the Manager's default).
"""

import argparse
import os
import signal
import sys

sys.path.insert(0, os.getcwd())  # the repository root: tests.integration.live_shapes

import ftrun.checkpoint as ckpt
from tests.integration.live_shapes import SHAPES, Shape


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--job", required=True)
    p.add_argument("--directory", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--shape", choices=SHAPES, required=True)
    p.add_argument("--die", choices=["forward", "after-save", "save"], required=True)
    p.add_argument("--live", action="store_true")
    p.add_argument("--full-copy-every", type=int, default=1000)
    args = p.parse_args()
    shape = Shape(args.shape)
    options = {"live_snapshot": True} if args.live else {}
    mgr = ckpt.Manager(
        args.directory,
        job_id=args.job,
        persist_every=10**9,
        full_copy_every=args.full_copy_every,
        **options,
    )
    mgr.restore(shape.state)
    for step in range(1, args.steps + 1):
        shape.step()
        if args.die == "save" and step == args.steps:
            print(f"SAVES {mgr.stats.saves + 1} {mgr.stats.live_saves}", flush=True)
            mgr._commit = lambda *_a, **_k: die()  # type: ignore[method-assign]
        mgr.save(step, shape.state)
    print(f"SAVES {mgr.stats.saves} {mgr.stats.live_saves}", flush=True)
    if args.die == "after-save":
        die()
    x = shape.loader.next()
    if args.shape in ("ema_eval", "ema_eval_data"):  # killed in the evaluation's forward pass
        shape.swap_in_ema()
        shape.model.eval()
        shape.model(x)
    else:
        shape.before_step(x)
        shape.loss(x).backward()
    die()


if __name__ == "__main__":
    main()
