"""Profiling a model's layers in one process: the figures the planner needs (profile.json).

Per layer (top-level child), in forward order:
- forward and backward time of one micro-batch as a + b*m seconds, fitted through the times of
  timed repeats (after warm-up) at two micro-batch sizes, m and 2m (`_sustained`: each
  layer's fastest run, scaled so that the layers add up to their mean). Each layer's backward is
  timed alone: its input is a detached leaf, so autograd stops at the layer. The loss is part of
  the last layer. The mean, over passes that span at least MIN_TIMED_S at each size, is the
  device's sustained speed: a device held to a share of its time (a CPU quota, a shared or
  throttled host) runs short operations at full speed between its stalls, so the median of an
  operation much shorter than a stall times the device as if it never stalled (2.6x too fast at
  0.4 of a core), and of one about as long is a lottery (docs/planner.md).
- state_bytes: parameters + gradients + optimizer state. The runtime does not know the optimizer
  when it profiles, so this is 4 x the parameter bytes, what Adam/AdamW hold (exp_avg and
  exp_avg_sq); SGD with momentum holds less, so the figure is an upper bound for it.
- act_bytes: bytes autograd saves for backward per sample (saved_tensors_hooks, each storage
  counted once, parameters not counted), as the slope between the two micro-batch sizes, so
  constants such as an attention mask do not count per sample.
- out_bytes: the layer's output per sample, what a stage ending there sends downstream.
- opt_s: one optimizer step over the layer's parameters; and beside the layers, the device's
  share of a core and the bytes a second it reduces in a DP all-reduce (profile_step.py).
Links are left out: the planner uses its defaults for them.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ftrun.outputs import write_output
from ftrun.parallel import profile_step

Samples = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

WARMUP = 2
REPEATS = 5  # timed passes at each micro-batch size, at least ...
MIN_TIMED_S = 0.5  # ... and as many more as span this long (scheduler periods are ~10 ms) ...
MAX_REPEATS = 200  # ... up to this many


def _storage_key(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


class SavedBytes:
    """Counts the bytes autograd saves for backward while active (each storage once)."""

    def __init__(self, exclude: Sequence[torch.Tensor] = ()) -> None:
        self._exclude = {_storage_key(t) for t in exclude}
        self._seen: set[tuple[int, int]] = set()
        self.total = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in self._exclude and key not in self._seen:
            self._seen.add(key)
            self.total += key[1]
        return t

    def __enter__(self) -> SavedBytes:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _leaf(x: torch.Tensor) -> torch.Tensor:
    x = x.detach()
    return x.requires_grad_(True) if x.is_floating_point() else x


def _one_pass(
    layers: Sequence[nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: LossFn,
    device: torch.device,
) -> tuple[list[float], list[float], list[int], list[int]]:
    """One forward and backward, layer by layer: (fwd s, bwd s, saved bytes, output bytes)."""
    params = [p for layer in layers for p in layer.parameters()]
    fwd, bwd, saved, out_bytes = [], [], [], []
    inputs, outputs = [], []
    for i, layer in enumerate(layers):
        inp = _leaf(x)
        _sync(device)
        t0 = time.perf_counter()
        with SavedBytes(exclude=params) as counter:
            out = layer(inp)
            result = loss_fn(out, y) if i == len(layers) - 1 else out
        _sync(device)
        fwd.append(time.perf_counter() - t0)
        saved.append(counter.total)
        out_bytes.append(out.numel() * out.element_size())
        inputs.append(inp)
        outputs.append(result)
        x = out.detach()
    grad: torch.Tensor | None = None
    bwd = [0.0] * len(layers)
    for i in reversed(range(len(layers))):
        _sync(device)
        t0 = time.perf_counter()
        torch.autograd.backward(outputs[i], grad_tensors=grad)
        _sync(device)
        bwd[i] = time.perf_counter() - t0
        grad = inputs[i].grad
    for layer in layers:
        layer.zero_grad(set_to_none=True)
    return fwd, bwd, saved, out_bytes


def measure(
    layers: Sequence[nn.Module],
    samples: Samples,
    loss_fn: LossFn,
    sizes: tuple[int, int],
    device: torch.device,
    *,
    warmup: int = WARMUP,
    repeats: int = REPEATS,
    min_timed_s: float = MIN_TIMED_S,
) -> list[dict[str, Any]]:
    """Per-layer figures (see the module docstring), fitted over the two micro-batch sizes."""
    m1, m2 = sizes
    runs: dict[int, list[tuple[list[float], list[float], list[int], list[int]]]] = {}
    for m in sizes:
        x, y = (t.to(device) for t in samples(0, m))
        for _ in range(warmup):
            _one_pass(layers, x, y, loss_fn, device)
        runs[m] = []
        t0 = time.perf_counter()
        while len(runs[m]) < repeats or (
            time.perf_counter() - t0 < min_timed_s and len(runs[m]) < MAX_REPEATS
        ):
            runs[m].append(_one_pass(layers, x, y, loss_fn, device))
    times = {m: _sustained(runs[m]) for m in sizes}
    out = []
    for i in range(len(layers)):
        fit: dict[str, list[float]] = {}
        for key, k in (("fwd_s", 0), ("bwd_s", 1)):
            t1, t2 = times[m1][k][i], times[m2][k][i]
            b = max((t2 - t1) / (m2 - m1), 0.0)
            a = max(t1 - b * m1, 0.0)
            fit[key] = [a, b]
        saved1, saved2 = runs[m1][-1][2][i], runs[m2][-1][2][i]
        out_b = runs[m2][-1][3][i]
        n_params = sum(p.numel() * p.element_size() for p in layers[i].parameters())
        out.append(
            {
                **fit,
                "state_bytes": 4 * n_params,
                "act_bytes": max((saved2 - saved1) // (m2 - m1), 0) or saved2 // m2,
                "out_bytes": out_b // m2,
            }
        )
    return out


def _sustained(
    runs: Sequence[tuple[list[float], list[float], list[int], list[int]]],
) -> tuple[list[float], list[float]]:
    """(forward, backward) seconds per layer: each layer's fastest run, all scaled by one factor
    so that they add up to the layers' mean. The fastest run gives each layer its share, free
    of stalls (a stall falls on one layer and not another; identical blocks must time alike);
    the mean gives the device's sustained speed, stalls included."""
    fwd = [min(col) for col in zip(*(r[0] for r in runs), strict=True)]
    bwd = [min(col) for col in zip(*(r[1] for r in runs), strict=True)]
    mean = statistics.fmean(sum(r[0]) + sum(r[1]) for r in runs)
    fastest = sum(fwd) + sum(bwd)
    scale = mean / fastest if fastest > 0 else 1.0
    return [t * scale for t in fwd], [t * scale for t in bwd]


def write_profile(
    path: str | os.PathLike[str],
    model: nn.Module,
    samples: Samples,
    loss_fn: LossFn,
    *,
    micro_batch: int,
    global_batch: int | None,
    device_memory_bytes: int | None,
    device: torch.device,
) -> dict[str, Any]:
    """Measure every layer of `model` on `device` and write profile.json (contract version 1)."""
    children = list(model.named_children())
    layers = [layer for _, layer in children]
    model.to(device)
    cpu0, t0 = time.process_time(), time.perf_counter()
    figures = measure(layers, samples, loss_fn, (micro_batch, 2 * micro_batch), device)
    share = profile_step.cpu_share(time.process_time() - cpu0, time.perf_counter() - t0)
    for fig, opt_s in zip(figures, profile_step.optimizer_seconds(layers), strict=True):
        fig["opt_s"] = opt_s
    device_doc: dict[str, float] = {}
    if device.type == "cpu":  # gloo reduces on the CPU; an accelerator's reduction is the link's
        grads = sum(p.numel() * p.element_size() for p in model.parameters())
        reduce = profile_step.reduce_bytes_per_s(grads, share)
        device_doc = {"cpu_share": share} | ({"reduce_bytes_per_s": reduce} if reduce else {})
    doc = {
        "version": 1,
        "model": type(model).__name__,
        "global_batch": global_batch,
        "device_memory_bytes": device_memory_bytes,
        "layers": [{"name": name, **fig} for (name, _), fig in zip(children, figures, strict=True)],
        "device": device_doc,
        "links": {},
    }
    # temp + rename, never through a link planted at the name (ftrun/outputs.py)
    write_output(Path(path), (json.dumps(doc, indent=2) + "\n").encode(), flag="the profile")
    return doc
