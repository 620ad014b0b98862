"""The training states of the crash corpus (crash_corpus.py): each one a model, its optimizer
and what else the state holds, trained one step at a time the way users train it.

Each shape is ~20-30 MiB of CPU state per rank, over the live snapshot's 16 MiB, so the
default Manager keeps it live (ftrun/checkpoint/live.py). Data comes from a generator seeded
by the step and rank, so a run is a function of its start state: the uninterrupted run and a
restored one are comparable bit for bit. A shape's `step(n, hooks)` does the step's work and
leaves the state as `save(n)` should see it; `hooks` lets the corpus kill at chosen moments.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import torch
import torch.nn as nn

import ftrun.checkpoint as ckpt

WIDTH = 1024


def batch(step: int, rank: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(step * 1000 + rank))


class Shape:
    """A plain MLP with AdamW: the baseline."""

    name = "plain"
    micro_batches = 1

    def __init__(self, rank: int, world: int) -> None:
        torch.manual_seed(0)
        self.rank, self.world = rank, world
        self.model = self.build()
        self.wrapped: nn.Module = self.model
        if world > 1:
            self.wrapped = nn.parallel.DistributedDataParallel(self.model)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.extra: dict[str, Any] = {"seen": 0}

    def build(self) -> nn.Module:
        return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH))

    def state(self) -> dict[str, Any]:
        return {"train": ckpt.TrainState(self.model, self.opt), "extra": self.extra}

    def inputs(self, step: int, micro: int = 0) -> torch.Tensor:
        return batch(step * 8 + micro, self.rank, 16, WIDTH)

    def loss(self, x: torch.Tensor) -> torch.Tensor:
        return self.wrapped(x).square().mean()

    def step(self, n: int, hooks: Hooks) -> None:
        self.opt.zero_grad(set_to_none=True)
        for micro in range(self.micro_batches):
            hooks.micro = micro
            self.loss(self.inputs(n, micro)).backward()
        self.opt.step()
        self.extra["seen"] = n

    def after_save(self, n: int, hooks: Hooks) -> None:
        """What the loop does between save(n) and the next step (an evaluation)."""

    def tensors(self) -> dict[str, torch.Tensor]:
        """Everything the state holds, by name, for the comparison."""
        out = {f"model.{k}": v for k, v in self.model.state_dict().items()}
        for i, s in enumerate(
            self.opt.state[p] for g in self.opt.param_groups for p in g["params"]
        ):
            out.update({f"opt.{i}.{k}": v for k, v in s.items() if isinstance(v, torch.Tensor)})
        return out

    def digest(self) -> str:
        h = hashlib.sha256(str(self.extra["seen"]).encode())
        for key, t in sorted(self.tensors().items()):
            h.update(key.encode())
            h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()


class Tied(Shape):
    """An embedding whose weight is the output layer's too."""

    name = "tied"

    def build(self) -> nn.Module:
        emb = nn.Embedding(4096, 768)
        head = nn.Linear(768, 4096, bias=False)
        head.weight = emb.weight
        return nn.ModuleDict({"emb": emb, "mid": nn.Linear(768, 768), "head": head})

    def inputs(self, step: int, micro: int = 0) -> torch.Tensor:
        g = torch.Generator().manual_seed(step * 1000 + self.rank)
        return torch.randint(0, 4096, (32,), generator=g)

    def loss(self, x: torch.Tensor) -> torch.Tensor:
        m = self.model
        h = torch.tanh(m["mid"](m["emb"](x)))  # type: ignore[index]
        return nn.functional.cross_entropy(m["head"](h), x)  # type: ignore[index]


class Sam(Shape):
    """Sharpness-aware minimisation: the weights are moved up the gradient in place, a second
    forward and backward run there, and they are moved back before the optimizer step."""

    name = "sam"

    def step(self, n: int, hooks: Hooks) -> None:
        x = self.inputs(n)
        self.opt.zero_grad(set_to_none=True)
        self.loss(x).backward()
        params = [p for p in self.model.parameters() if p.grad is not None]
        with torch.no_grad():
            norm = torch.norm(torch.stack([p.grad.norm() for p in params]))  # type: ignore[union-attr]
            eps = [p.grad * (0.05 / (norm + 1e-12)) for p in params]  # type: ignore[operator]
            for p, e in zip(params, eps, strict=True):
                p.add_(e)
        self.opt.zero_grad(set_to_none=True)
        hooks.micro = 1
        self.loss(x).backward()
        with torch.no_grad():
            for p, e in zip(params, eps, strict=True):
                p.sub_(e)
        self.opt.step()
        self.extra["seen"] = n


class EmaModule(Shape):
    """An exponential moving average of the weights, kept as a module in the state."""

    name = "ema module"

    def __init__(self, rank: int, world: int) -> None:
        super().__init__(rank, world)
        self.ema = copy.deepcopy(self.model).requires_grad_(False)

    def state(self) -> dict[str, Any]:
        return {**super().state(), "ema": self.ema.state_dict()}

    def step(self, n: int, hooks: Hooks) -> None:
        super().step(n, hooks)
        with torch.no_grad():
            for e, p in zip(self.ema.parameters(), self.model.parameters(), strict=True):
                e.mul_(0.99).add_(p, alpha=0.01)

    def tensors(self) -> dict[str, torch.Tensor]:
        out = super().tensors()
        out.update({f"ema.{k}": v for k, v in self.ema.state_dict().items()})
        return out


class EmaSwap(EmaModule):
    """EMA weights swapped into the model for an evaluation every other step (in place), and
    the training weights swapped back after it: between one save and the next step."""

    name = "ema swap"

    def after_save(self, n: int, hooks: Hooks) -> None:
        if n % 2:
            return
        with torch.no_grad():
            backup = [p.detach().clone() for p in self.model.parameters()]
            for p, e in zip(self.model.parameters(), self.ema.parameters(), strict=True):
                p.copy_(e)
            hooks.evaluating = True
            self.model(self.inputs(n, 7)).sum()  # the evaluation
            hooks.evaluating = False
            for p, b in zip(self.model.parameters(), backup, strict=True):
                p.copy_(b)


class ManualUpdate(Shape):
    """The last layer is trained by hand (`p -= lr * grad`), outside the optimizer, before the
    optimizer step of the rest."""

    name = "manual update"

    def __init__(self, rank: int, world: int) -> None:
        super().__init__(rank, world)
        head = list(self.model[2].parameters())  # type: ignore[index]
        rest = [p for p in self.model.parameters() if all(p is not h for h in head)]
        self.head = head
        self.opt = torch.optim.AdamW(rest, lr=1e-3)

    def step(self, n: int, hooks: Hooks) -> None:
        self.opt.zero_grad(set_to_none=True)
        for p in self.head:
            p.grad = None
        self.loss(self.inputs(n)).backward()
        with torch.no_grad():
            for p in self.head:
                p.sub_(p.grad, alpha=0.01)  # type: ignore[arg-type]
        self.opt.step()
        self.extra["seen"] = n


class ChannelsLast(Shape):
    """Convolutions in channels_last memory format (not contiguous: copied at every save)."""

    name = "channels_last"

    def build(self) -> nn.Module:
        model = nn.Sequential(
            nn.Conv2d(256, 512, 3, padding=1), nn.ReLU(), nn.Conv2d(512, 256, 3, padding=1)
        )
        return model.to(memory_format=torch.channels_last)

    def inputs(self, step: int, micro: int = 0) -> torch.Tensor:
        x = batch(step, self.rank, 2, 256, 6, 6)
        return x.to(memory_format=torch.channels_last)


class RunningStats(nn.Module):
    """A running mean of the activations in a 256 KiB buffer, updated by every forward pass."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("running", torch.zeros(4, 16 * WIDTH))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.running.mul_(0.9).add_(h.detach().flatten(), alpha=0.1)
        return h


class LargeBuffers(Shape):
    """A buffer of 256 KiB, over the 64 KiB that save() copies itself, updated by every
    forward pass (as wide BatchNorm statistics are)."""

    name = "large buffers"

    def build(self) -> nn.Module:
        return nn.Sequential(
            nn.Linear(WIDTH, WIDTH), nn.Tanh(), RunningStats(), nn.Linear(WIDTH, WIDTH)
        )


class GradAccumulation(Shape):
    """Four micro-batches per optimizer step."""

    name = "grad accumulation"
    micro_batches = 4


class Ddp(Shape):
    """Two ranks, DistributedDataParallel on gloo (the world size is the corpus's doing)."""

    name = "2-rank DDP"
    world = 2


class Hooks:
    """What a shape tells the corpus while it steps: which micro-batch, whether it evaluates."""

    micro = 0
    evaluating = False


SHAPES: dict[str, type[Shape]] = {
    cls.name: cls
    for cls in (
        Shape,
        Tied,
        Sam,
        EmaModule,
        EmaSwap,
        ManualUpdate,
        ChannelsLast,
        LargeBuffers,
        GradAccumulation,
        Ddp,
    )
}


def world_of(name: str) -> int:
    return int(getattr(SHAPES[name], "world", 1))
