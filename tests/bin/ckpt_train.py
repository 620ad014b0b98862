"""A DDP training script (gloo, CPU) that checkpoints with ftrun.checkpoint and resumes exactly.

Every source of randomness is in the checkpoint: the data loader's own generator and position
(PerRank), dropout and noise from torch's global RNG, and a Python `random` draw. Each rank prints
`LOSS rank=R step=N loss=<float.hex>`, so two runs compare bit for bit. A fault is injected
deterministically like tests/bin/train_toy.py: --fail-at STEP on --fail-rank R, a SIGKILL after
the backward pass (mid-step, while the previous snapshot may still be copying; the other ranks'
gradients are reduced, so they go on to their optimizer step and save), or with --fail-in
forward after the forward pass (the other ranks wait in the backward's all-reduce), with
--fail-once MARKER only the first time. --full-copy-every N, --live-snapshot: ftrun.checkpoint's
options.

Three more knobs shape the run that fails (before --fail-once's marker exists), each at a known
point rather than by racing a sleep: --slow-persist-rank R persists at 200 B/s on rank R, so its
first persist keeps a slot pinned past the fault (a worker starved on a busy host);
--hold-snapshot N never commits the fail rank's snapshot of step N (its copy is done, its manifest
not written), as if the rank were killed while that copy ran; --fail-after-peers S makes the fault
wait until every other rank has finished the step, its save included (their --record lines), or
S seconds have passed (a rank that waits inside that save never finishes it).

--record DIR: each rank appends `STEP n <wall time>` to DIR/g<generation>-r<rank>.txt after each
step, on the shared filesystem, so a test sees what a rank did even when its host is cut off
from the controller; a save refused because a newer generation has claimed the checkpoint
directories (ftrun.checkpoint.Superseded) is recorded as `SUPERSEDED n <wall time> <message>`,
and the rank exits 3.
"""

import argparse
import os
import random
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

import ftrun
import ftrun.checkpoint as ckpt


class Loader:
    """A shuffling data source whose position and generator are checkpoint state."""

    def __init__(self, rank: int, width: int) -> None:
        self.width = width
        self.generator = torch.Generator().manual_seed(1000 + rank)
        self.position = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.position += 1
        x = torch.randn(16, self.width, generator=self.generator)
        return x, x.sum(dim=1, keepdim=True).sin()

    def state_dict(self) -> dict:
        return {"position": self.position, "generator": self.generator.get_state()}

    def load_state_dict(self, sd: dict) -> None:
        self.position = sd["position"]
        self.generator.set_state(sd["generator"])


def fail(rank: int, step: int, once: str | None) -> None:
    if once:
        open(once, "w").close()
    print(f"FAULT rank={rank} step={step}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def wait_for_peers(record_dir: str, generation: str, rank: int, step: int, limit: float) -> None:
    """Until every other rank has recorded `step` as finished (its save included), or `limit` s."""
    want = f"STEP {step} "
    others = [r for r in range(dist.get_world_size()) if r != rank]
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        finished = 0
        for r in others:
            try:
                with open(os.path.join(record_dir, f"g{generation}-r{r}.txt")) as f:
                    finished += any(line.startswith(want) for line in f)
            except FileNotFoundError:
                pass
        if finished == len(others):
            return
        time.sleep(0.01)


def hold_snapshot(mgr: ckpt.Manager, step: int) -> None:
    """The snapshot of `step` is copied but never committed (the rank is killed first)."""
    commit = mgr._commit  # what a save's copy calls to write its manifest (manager.py)

    def held(index, meta):
        if meta.step == step:
            threading.Event().wait()
        return commit(index, meta)

    mgr._commit = held


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--save-every", type=int, default=1)
    p.add_argument("--ckpt-dir", default=None, help="default: $FTRUN_JOB_DIR/checkpoints")
    p.add_argument("--no-memory", action="store_true", help="storage tier only")
    p.add_argument("--memory-slots", type=int, default=None)  # None: the Manager's default
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--fail-at", type=int, default=None)
    p.add_argument("--fail-rank", type=int, default=0)
    p.add_argument("--fail-once", default=None)
    p.add_argument("--fail-in", choices=["forward", "backward"], default="backward")
    p.add_argument("--full-copy-every", type=int, default=None)
    p.add_argument("--live-snapshot", action="store_true")
    p.add_argument("--persist-every", type=int, default=1)
    p.add_argument(
        "--persist-interval",
        type=float,
        default=0.0,
        help="seconds between persists (default 0: tests want the storage tier current; ftrun's "
        "own default is to write at most a quarter of the time)",
    )
    p.add_argument("--persist-bandwidth", type=float, default=None, help="MB/s (default: ftrun's)")
    p.add_argument("--step-time", type=float, default=0.0, help="seconds a step takes at least")
    p.add_argument(
        "--first-generation-step-time",
        type=float,
        default=None,
        help="generation 1's --step-time (a zombie that must outlive the next one's start)",
    )
    p.add_argument("--keep", type=int, default=3, help="committed checkpoints kept")
    p.add_argument("--slow-persist-rank", type=int, default=None, help="see the module doc")
    p.add_argument("--hold-snapshot", type=int, default=None, help="see the module doc")
    p.add_argument("--fail-after-peers", type=float, default=None, help="seconds; module doc")
    p.add_argument("--record", default=None, help="a directory for what each rank did")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    random.seed(rank)
    net = nn.Sequential(
        nn.Linear(args.width, args.width), nn.ReLU(), nn.Dropout(0.2), nn.Linear(args.width, 1)
    )
    model = DistributedDataParallel(net)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = Loader(rank, args.width)
    first = not (args.fail_once and os.path.exists(args.fail_once))  # the run that fails
    bandwidth = args.persist_bandwidth
    if first and rank == args.slow_persist_rank:
        bandwidth = 0.0002  # MB/s: ~65 s for this state, long past the fault
    state = {"train": ckpt.TrainState(net, opt), "data": ckpt.PerRank(loader)}
    mgr = ckpt.Manager(
        args.ckpt_dir,
        memory=False if args.no_memory else None,
        persist_every=args.persist_every,
        persist_interval=args.persist_interval,
        keep=args.keep,
        full_copy_every=args.full_copy_every,
        live_snapshot=args.live_snapshot,
        **({} if bandwidth is None else {"persist_bandwidth": bandwidth}),
        **({} if args.memory_slots is None else {"memory_slots": args.memory_slots}),
    )
    if first and args.hold_snapshot is not None and rank == args.fail_rank:
        hold_snapshot(mgr, args.hold_snapshot)
    generation = os.environ.get("FTRUN_GENERATION", "0")

    def record(line: str) -> None:
        if args.record:
            with open(os.path.join(args.record, f"g{generation}-r{rank}.txt"), "a") as f:
                f.write(f"{line}\n")

    step_time = args.step_time
    if generation == "1" and args.first_generation_step_time is not None:
        step_time = args.first_generation_step_time
    start = mgr.restore(state)
    print(f"RESTORED rank={rank} step={start} tier={mgr.restored.tier}", flush=True)

    for step in range(start + 1, args.steps + 1):
        if step_time:  # a slower "model": time for a test to act in the middle of a run
            time.sleep(step_time)
        x, y = loader.next()
        x = x + 0.01 * random.random() * torch.randn_like(x)
        loss = nn.functional.mse_loss(model(x), y)
        failing = (
            args.fail_at == step
            and rank == args.fail_rank
            and not (args.fail_once and os.path.exists(args.fail_once))
        )
        if failing and args.fail_in == "forward":
            fail(rank, step, args.fail_once)
        opt.zero_grad()
        loss.backward()
        if failing:
            if args.fail_after_peers is not None:
                wait_for_peers(args.record, generation, rank, step, args.fail_after_peers)
            fail(rank, step, args.fail_once)
        opt.step()
        ftrun.step(step)
        print(f"LOSS rank={rank} step={step} loss={loss.item().hex()}", flush=True)
        if step % args.save_every == 0:
            try:
                mgr.save(step, state)
            except ckpt.Superseded as exc:
                record(f"SUPERSEDED {step} {time.time()} {exc}")
                print(f"SUPERSEDED rank={rank} step={step}: {exc}", flush=True)
                os._exit(3)
        record(f"STEP {step} {time.time()}")
    mgr.close()
    stats = mgr.stats
    print(
        f"DONE rank={rank} persisted={stats.last_persisted_step} saves={stats.saves} "
        f"persists={stats.persists} votes={stats.votes}",
        flush=True,
    )
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # see tests/bin/train_toy.py: skip a teardown abort seen with torch 2.13 + gloo


if __name__ == "__main__":
    main()
