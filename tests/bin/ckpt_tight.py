"""One rank that checkpoints every step into a memory tier that may not fit (a small tmpfs as the
tier root), then restores in a second Manager, as a restart in place would.

--state-mib: the checkpointed state (a linear model + AdamW's two moments: 3 x the parameters);
--fill-at STEP: after that step's save, fill the tier root with a file until it is full (another
user filling /dev/shm mid-run). Prints `LEVEL <level>` (the tier this rank ended at),
`CLOSED <step persisted>` and `RESTORED <step> <tier>`; exits 0 unless a checkpoint call raised.
"""

import argparse
import errno
import os
from pathlib import Path

import torch

import ftrun.checkpoint as ckpt


def fill(root: Path) -> None:
    """Write a file into `root` until the filesystem is full."""
    chunk = b"\xff" * (1 << 20)
    fd = os.open(root / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                os.write(fd, chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 4096:
                    break
                chunk = chunk[: len(chunk) // 2]
    finally:
        os.close(fd)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True, help="the memory tier's root (a small tmpfs)")
    p.add_argument("--storage", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--state-mib", type=float, default=24)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--no-live", action="store_true")
    p.add_argument("--fill-at", type=int, default=None)
    args = p.parse_args()
    torch.manual_seed(0)
    n = int(args.state_mib * 2**20 / 4 / 3)  # float32 parameters, AdamW: x3
    model = torch.nn.Linear(n // 8, 8, bias=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    options = dict(
        job_id=args.job,
        memory_root=args.root,
        live_snapshot=not args.no_live,
        persist_interval=0,
        persist_every=3,
    )
    state = {"train": ckpt.TrainState(model, opt), "extra": {"step": 0}}
    mgr = ckpt.Manager(args.storage, **options)
    start = mgr.restore(state)
    x = torch.randn(4, n // 8)
    for step in range(start + 1, args.steps + 1):
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        state["extra"]["step"] = step
        mgr.save(step, state)
        if step == args.fill_at:
            mgr.wait_snapshot()
            fill(Path(args.root))
            print(f"FILLED after step {step}", flush=True)
    level = getattr(mgr, "_capacity", None)  # what the test checks
    print(f"SLOTS {mgr._slots.usable}", flush=True)  # copies kept (3, or 2 in a tight tier)
    mgr.close()
    print(f"LEVEL {level.level.name.lower() if level else 'unknown'}", flush=True)
    print(f"CLOSED {mgr.stats.last_persisted_step}", flush=True)
    weights = model.weight.detach().clone()
    again = ckpt.Manager(args.storage, **options)
    model.weight.data.zero_()
    step = again.restore(state)
    same = torch.equal(model.weight.detach(), weights)
    print(f"RESTORED {step} {again.restored.tier} {'same' if same else 'differs'}", flush=True)
    again.close(persist_last=False)


if __name__ == "__main__":
    main()
