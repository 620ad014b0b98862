"""A one-rank training script whose checkpoint goes bad: in the first generation only (--once
MARKER), the weights turn NaN in the optimizer step of --poison-at (a bad batch, an overflow),
and that step is saved as it is. From the next step on the loss is NaN, and the script raises
`FloatingPointError: loss is NaN` there, as a NaN check in a training loop does. Every
generation that restores the poisoned step fails the same way, right after the restore; one
that restores an older step trains on to --steps and exits 0.

Each rank prints `RESTORED <step>` after its restore and `LOSS step=N loss=<float.hex>` after
each step. Saves go to the memory tier and are persisted at every step.
"""

import argparse
import os

import torch

import ftrun
import ftrun.checkpoint as ckpt


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--poison-at", type=int, default=5)
    p.add_argument("--once", required=True)
    args = p.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mgr = ckpt.Manager(persist_every=1, persist_interval=0, persist_bandwidth=0)
    state = {"train": ckpt.TrainState(model, opt)}
    start = mgr.restore(state)
    print(f"RESTORED {start}", flush=True)
    for step in range(start + 1, args.steps + 1):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step))  # batch `step`
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        if torch.isnan(loss):
            raise FloatingPointError(f"loss is NaN at step {step}")
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == args.poison_at and not os.path.exists(args.once):
            open(args.once, "w").close()
            with torch.no_grad():
                model.weight.fill_(float("nan"))
        mgr.save(step, state)
        mgr.wait_persist()
        print(f"LOSS step={step} loss={loss.item().hex()}", flush=True)
        ftrun.step(step)
    mgr.close()


if __name__ == "__main__":
    main()
