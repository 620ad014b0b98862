"""A small DDP training script for tests and benchmarks (gloo on CPU).

Checkpoints with torch.save every --ckpt-every steps and resumes from the newest checkpoint, so a
restarted run continues. Faults are injected deterministically: --fail-at STEP on --fail-rank R,
as a SIGKILL, an exception, or an exit code; with --fail-once MARKER only the first time. With
--stop-file PATH it ends (all ranks at the same step) once PATH exists: a test that changes the
job's hosts while it runs lets it finish when it is done, not when a step count races it.
"""

import argparse
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import ftrun

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--ckpt-dir", default=None)
p.add_argument("--ckpt-every", type=int, default=5)
p.add_argument("--fail-at", type=int, default=None)
p.add_argument("--fail-rank", type=int, default=0)
p.add_argument(
    "--fail-how", choices=["sigkill", "sigstop", "wait", "exception", "exit"], default="sigkill"
)
p.add_argument("--fail-once", default=None, help="marker file: fail only if it does not exist")
p.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step")
p.add_argument("--width", type=int, default=64)
p.add_argument("--stop-file", default=None, help="end once this file exists")
args = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
print(f"WORLD {world} rank {rank} on {os.environ.get('FTRUN_HOST', '?')}", flush=True)
torch.manual_seed(0)
model = DistributedDataParallel(
    torch.nn.Sequential(
        torch.nn.Linear(args.width, args.width), torch.nn.ReLU(), torch.nn.Linear(args.width, 1)
    )
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)

start = 0
ckpt = os.path.join(args.ckpt_dir, "ckpt.pt") if args.ckpt_dir else None
if ckpt and os.path.exists(ckpt):
    state = torch.load(ckpt)
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"]
    print(f"resumed from step {start}", flush=True)

for step in range(start + 1, args.steps + 1):
    if (
        args.fail_at == step
        and rank == args.fail_rank
        and not (args.fail_once and os.path.exists(args.fail_once))
    ):
        if args.fail_once:
            open(args.fail_once, "w").close()
        print(f"FAULT t={time.time():.6f} injecting {args.fail_how} at step {step}", flush=True)
        if args.fail_how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if args.fail_how == "sigstop":  # a hang: the process is there, and does nothing
            os.kill(os.getpid(), signal.SIGSTOP)
        if args.fail_how == "wait":  # a deadlock: it waits for what never comes, the others for it
            threading.Event().wait()
        if args.fail_how == "exception":
            raise RuntimeError(f"injected failure at step {step}")
        sys.exit(7)
    gen = torch.Generator().manual_seed(step * world + rank)
    x = torch.randn(16, args.width, generator=gen)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if args.step_time:
        time.sleep(args.step_time)
    ftrun.step(step)
    print(f"STEP {step} t={time.time():.6f} loss={loss.item():.6f}", flush=True)
    if ckpt and step % args.ckpt_every == 0 and rank == 0:
        torch.save(
            {"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step},
            ckpt + ".tmp",
        )
        os.replace(ckpt + ".tmp", ckpt)
    if ckpt and step % args.ckpt_every == 0:
        dist.barrier()
    if args.stop_file:  # every rank's view, so that all stop at the same step
        seen = torch.tensor([float(os.path.exists(args.stop_file))])
        dist.all_reduce(seen, op=dist.ReduceOp.MAX)
        if seen.item():
            break

dist.barrier()
dist.destroy_process_group()
print(f"done rank {rank}", flush=True)
# torch 2.13 + gloo: a DDP process sometimes aborts in interpreter teardown ("terminate called
# without an active exception", ~1 run in 5 under plain torchrun here). Skip the teardown.
sys.stdout.flush()
os._exit(0)
