"""Trains tests/integration/ckpt_helpers.Toy (19 MiB of state: the live snapshot is on) with a
snapshot after every step in the memory tier of --job, persisting every --persist-every-th
step (waiting for it, so storage holds it for sure), and dies by SIGKILL in the forward pass of
step --steps + 1: the live snapshot holds step --steps, the slots the last full copies,
storage the persisted steps. Prints `SAVED <steps>` before dying.
"""

import argparse
import os
import signal
import sys

sys.path.insert(0, os.getcwd())  # the repository root: tests.integration.ckpt_helpers

import ftrun.checkpoint as ckpt
from tests.integration.ckpt_helpers import Toy


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--job", required=True)
    p.add_argument("--directory", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--persist-every", type=int, required=True)
    args = p.parse_args()
    toy = Toy(width=1280)
    mgr = ckpt.Manager(
        args.directory,
        job_id=args.job,
        persist_every=args.persist_every,
        persist_interval=0,
        persist_bandwidth=0,
        full_copy_every=1000,  # full copies only where persisted: the live file holds the rest
        live_snapshot=True,  # opt-in since issue 33
    )
    mgr.restore(toy.state)
    for step in range(1, args.steps + 1):
        toy.step()
        mgr.save(step, toy.state)
        if step % args.persist_every == 0:
            assert mgr.wait_persist(timeout=60)
    print(f"SAVED {args.steps}", flush=True)
    toy.model(toy.loader.next()).sum().backward()
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
