"""What a training step costs beyond its layers' forward and backward, profiled in one process.

Two figures for profile.json (docs/planner.md), both timed on the profiling device at its
sustained speed, as the layers are (ftrun/parallel/profile.py):

- `opt_s` per layer: one optimizer step over the layer's parameters. The runtime does not know
  the script's optimizer when it profiles; it times AdamW (torch's default implementation for
  the device), what state_bytes already assumes. Each layer's share is its fastest step, all
  scaled to the mean of the whole steps, over repeats that span at least MIN_TIMED_S
  (`profile._sustained`'s rule: under a CPU quota a step of a few ms is a lottery).
- `reduce_bytes_per_s`: the device's own work in the DP all-reduce, where the device reduces
  (gloo on a CPU): bytes of a rank's ring traffic per second of its CPU at the device's speed.
  Two gloo ranks, two threads of this process over loopback TCP, all-reduce a flat gradient
  buffer as `stages.average_grads` does (flatten, all-reduce, divide, copy back); a rank's CPU
  seconds are half the process's (the ring is symmetric), and the device runs them at its
  `cpu_share` of a core: the CPU seconds over the wall seconds of the layers' timed passes, at
  most 1 (0.4 under a 0.4-core quota). A 2-rank ring moves G bytes through each rank, so the
  figure is G / (a rank's seconds). The wire between hosts is not in it: that is the links'.
  On an accelerator the reduction runs on the device beside the link; nothing is measured.
"""

from __future__ import annotations

import datetime
import statistics
import threading
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn

MIN_TIMED_S = 0.3  # optimizer steps and all-reduces repeated to span this long, at least ...
REPEATS = 3  # ... and this many times
MAX_REPEATS = 100
MAX_REDUCE_BYTES = 64 << 20  # a larger model is timed on a buffer this size
_TIMEOUT = datetime.timedelta(seconds=60)


def optimizer_seconds(
    layers: Sequence[nn.Module],
    *,
    min_timed_s: float = MIN_TIMED_S,
    repeats: int = REPEATS,
) -> list[float]:
    """Seconds of one AdamW step over each layer's parameters (0 for a layer without any)."""
    opts: list[torch.optim.Optimizer | None] = []
    for layer in layers:
        params = [p for p in layer.parameters() if p.requires_grad]
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        opts.append(torch.optim.AdamW(params, lr=1e-6) if params else None)
    runs: list[list[float]] = []
    _steps(opts)  # warm-up: the moments are allocated at the first step
    t0 = time.perf_counter()
    while len(runs) < repeats or (
        time.perf_counter() - t0 < min_timed_s and len(runs) < MAX_REPEATS
    ):
        runs.append(_steps(opts))
    for layer in layers:
        layer.zero_grad(set_to_none=True)
    return sustained(runs)


def _steps(opts: Sequence[torch.optim.Optimizer | None]) -> list[float]:
    times = []
    for opt in opts:
        if opt is None:
            times.append(0.0)
            continue
        on_cuda = any(p.is_cuda for group in opt.param_groups for p in group["params"])
        t0 = time.perf_counter()
        opt.step()
        if on_cuda:  # the step is queued on the device: time it to its end
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times


def sustained(runs: Sequence[Sequence[float]]) -> list[float]:
    """Each part's fastest run, all scaled by one factor so they add up to the runs' mean."""
    fastest = [min(col) for col in zip(*runs, strict=True)]
    total = sum(fastest)
    mean = statistics.fmean(sum(r) for r in runs)
    scale = mean / total if total > 0 else 1.0
    return [t * scale for t in fastest]


def cpu_share(cpu_s: float, wall_s: float) -> float:
    """The share of a core the device gave a busy process: CPU over wall seconds, at most 1."""
    if wall_s <= 0 or cpu_s <= 0:
        return 1.0
    return min(cpu_s / wall_s, 1.0)


def reduce_bytes_per_s(
    grad_bytes: int,
    share: float,
    *,
    min_timed_s: float = MIN_TIMED_S,
    repeats: int = REPEATS,
    clock: Callable[[], float] = time.process_time,
) -> float | None:
    """Bytes a second a rank of this device reduces (see the module docstring); None when the
    buffer is empty."""
    n = min(grad_bytes, MAX_REDUCE_BYTES) // 4
    if n <= 0:
        return None
    store = dist.HashStore()
    groups: list[dist.ProcessGroupGloo | None] = [None, None]

    def connect(rank: int) -> None:
        groups[rank] = dist.ProcessGroupGloo(dist.PrefixStore("reduce", store), rank, 2, _TIMEOUT)

    grads = [[torch.randn(n // 2), torch.randn(n - n // 2)] for _ in range(2)]
    try:
        _both(connect)

        def average(rank: int) -> None:
            group = groups[rank]
            assert group is not None
            flat = torch._utils._flatten_dense_tensors(grads[rank])
            group.allreduce([flat]).wait(_TIMEOUT)  # type: ignore[attr-defined]
            flat.div_(2)
            unflat = torch._utils._unflatten_dense_tensors(flat, grads[rank])
            for g, avg in zip(grads[rank], unflat, strict=True):
                g.copy_(avg)

        _both(average)  # warm-up: connections, buffers
        done, cpu0, t0 = 0, clock(), time.perf_counter()
        while done < repeats or (time.perf_counter() - t0 < min_timed_s and done < MAX_REPEATS):
            _both(average)
            done += 1
        rank_cpu_s = (clock() - cpu0) / done / 2
    finally:
        for group in groups:
            if group is not None:
                group.shutdown()
    seconds = rank_cpu_s / max(share, 1e-3)
    return 4 * n / seconds if seconds > 0 else None


def _both(fn: Callable[[int], None]) -> None:
    """fn(0) and fn(1) in two threads, together (a collective needs both ranks); raises what
    either raised."""
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            fn(rank)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(_TIMEOUT.total_seconds())
    if errors:
        raise errors[0]
    if any(t.is_alive() for t in threads):
        raise TimeoutError("the profile's 2-rank all-reduce did not finish")
