"""Training states and loops of the shapes issue 33's audit found wrong or stale restores with
(tests/bin/shapes_child.py trains them and dies; the tests replay them uninterrupted):

  plain         a Linear model and AdamW: the live file holds all of it
  sam           SAM's two passes: the weights perturbed in place (`p.add_` under no_grad)
                between the save and the optimizer step, and put back after the second pass
  ema_eval      an EMA of the weights, swapped into the model for an evaluation with
                `model.load_state_dict` (then back)
  ema_eval_data the same swap written as `p.data.copy_(e)` (what many EMA helpers do)
  manual        an update by hand before the optimizer step, `p.data.add_(...)`
  manual_nograd the same written as `p.add_(...)` under `torch.no_grad()`
  ema_module    an EMA module saved beside the model (its tensors are not the live file's)
  channels_last a convolution in channels_last memory format (not contiguous: not adopted)
  big_buffer    a 256 KiB buffer the forward pass updates (buffers are never adopted)

All of them are over the live snapshot's 16 MiB minimum (AdamW on a 1280 x 1280 Linear).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

import ftrun.checkpoint as ckpt
from tests.integration.ckpt_helpers import Loader

WIDTH = 1280
SHAPES = (
    "plain",
    "sam",
    "ema_eval",
    "ema_eval_data",
    "manual",
    "manual_nograd",
    "ema_module",
    "channels_last",
    "big_buffer",
)
SAM_RHO = 0.05
EMA_DECAY = 0.9


class Net(torch.nn.Module):
    def __init__(self, shape: str) -> None:
        super().__init__()
        self.shape = shape
        self.fc = torch.nn.Linear(WIDTH, WIDTH)
        self.head = torch.nn.Linear(WIDTH, 1)
        if shape == "channels_last":  # 64 x 64 x 3 x 3: 144 KiB, over small_tensor_bytes
            self.conv = torch.nn.Conv2d(64, 64, 3, padding=1).to(memory_format=torch.channels_last)
        if shape == "big_buffer":
            self.register_buffer("stat", torch.zeros(64 * 1024))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.head(torch.tanh(self.fc(x)))
        if self.shape == "channels_last":
            img = x.view(-1, 64, 4, 5).contiguous(memory_format=torch.channels_last)
            y = y + self.conv(img).mean((1, 2, 3)).unsqueeze(1)
        if self.shape == "big_buffer":
            with torch.no_grad():
                self.stat.mul_(0.9).add_(x.mean().expand_as(self.stat), alpha=0.1)
        return y


class Shape:
    """One shape's model, optimizer, data and step; `state` is what the Manager saves."""

    def __init__(self, shape: str) -> None:
        assert shape in SHAPES, shape
        torch.manual_seed(0)
        self.shape = shape
        self.model = Net(shape)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.loader = Loader(width=WIDTH)
        self.ema = copy.deepcopy(self.model).requires_grad_(False)
        self.state: dict[str, Any] = {
            "train": ckpt.TrainState(self.model, self.opt),
            "data": ckpt.PerRank(self.loader),
        }
        if shape in ("ema_module", "ema_eval", "ema_eval_data"):
            self.state["ema"] = self.ema

    def loss(self, x: torch.Tensor) -> torch.Tensor:
        return (self.model(x) - x.sum(1, keepdim=True).sin()).pow(2).mean()

    def before_step(self, x: torch.Tensor) -> None:
        """What this shape does to the weights between the save and the optimizer step."""
        params = list(self.model.parameters())
        if self.shape == "sam":
            self.opt.zero_grad()
            self.loss(x).backward()
            with torch.no_grad():
                norm = torch.norm(torch.stack([p.grad.norm() for p in params]))  # type: ignore[union-attr]
                self._e = [p.grad * (SAM_RHO / (norm + 1e-12)) for p in params]  # type: ignore[operator]
                for p, e in zip(params, self._e, strict=True):
                    p.add_(e)  # SAM's first step: ascend to the sharpest point nearby
        elif self.shape in ("ema_eval", "ema_eval_data"):
            self.evaluate(x)
        elif self.shape == "manual":
            for p in params:
                p.data.add_(p.data, alpha=-1e-4)  # a hand-written decay, through .data
        elif self.shape == "manual_nograd":
            with torch.no_grad():
                for p in params:
                    p.add_(p, alpha=-1e-4)

    def swap_in_ema(self) -> list[torch.Tensor]:
        kept = [t.clone() for t in self.model.state_dict().values()]
        if self.shape == "ema_eval":
            self.model.load_state_dict(self.ema.state_dict())
        else:
            for p, e in zip(
                self.model.state_dict().values(), self.ema.state_dict().values(), strict=True
            ):
                p.data.copy_(e)
        return kept

    def swap_back(self, kept: list[torch.Tensor]) -> None:
        if self.shape == "ema_eval":
            self.model.load_state_dict(dict(zip(self.model.state_dict(), kept, strict=True)))
        else:
            for p, k in zip(self.model.state_dict().values(), kept, strict=True):
                p.data.copy_(k)

    def evaluate(self, x: torch.Tensor) -> None:
        kept = self.swap_in_ema()
        self.model.eval()
        with torch.no_grad():
            self.model(x)
        self.model.train()
        self.swap_back(kept)

    def step(self) -> None:
        x = self.loader.next()
        self.before_step(x)
        self.opt.zero_grad()
        self.loss(x).backward()
        if self.shape == "sam":
            with torch.no_grad():
                for p, e in zip(self.model.parameters(), self._e, strict=True):
                    p.sub_(e)  # back from the sharp point; the step takes its gradient
        self.opt.step()
        with torch.no_grad():
            for e, p in zip(self.ema.parameters(), self.model.parameters(), strict=True):
                e.mul_(EMA_DECAY).add_(p, alpha=1 - EMA_DECAY)

    def tensors(self) -> dict[str, torch.Tensor]:
        sd = self.state["train"].state_dict()
        flat = {f"model.{k}": v.clone() for k, v in sd["model"].items()}
        flat.update(
            {f"optim.{k}": v.clone() for k, v in sd["optim"].items() if isinstance(v, torch.Tensor)}
        )
        if "ema" in self.state:
            flat.update({f"ema.{k}": v.clone() for k, v in self.ema.state_dict().items()})
        return flat
