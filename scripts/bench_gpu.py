"""GPU snapshots: training throughput with a snapshot every step, against dcp.async_save.

    python scripts/bench_gpu.py [--dims 1024 2048] [--layers 16] [--rounds 3]

Needs a CUDA GPU (scripts/gpu_check.sh runs it on a lent machine). One process, one GPU: a stack
of pre-norm transformer layers with fp32 weights, bf16 autocast and AdamW (12 bytes of
checkpointed state per parameter), --accum micro-batches of --batch x --context tokens a step.
Per model size, windows of --steps steps alternate in one process, each ratio next to its own
baseline:

  none                 no checkpoint
  ftrun                a snapshot after every step: page-locked slots, side stream, the next
                       optimizer step waits on the GPU (ftrun/checkpoint/device_copy.py); the
                       persist to storage runs as by default
  ftrun, pageable      the same through the path GPU tensors took before: a plain copy_ into
                       pageable memory on the snapshot thread, waited for on the CPU
  dcp.async_save/N     torch.distributed.checkpoint.async_save every N steps (--dcp-every),
                       the previous save waited for first (as torchtitan does)

Reported: steps/s relative to none (all windows' time, and the median of the rounds' ratios);
the stall per save: the save() call, plus for dcp the wait for the previous save, plus for the
pageable path the optimizer step held on the CPU; and the copy rate of one snapshot on an idle
GPU (state bytes over the time until it is in host memory). A snapshot every step is hidden
when its copy takes less than a step: copy time / step time is about 2F / (B x tokens per step)
for F FLOP/s and B bytes/s of device-to-host bandwidth, whatever the model size.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager, nullcontext
from pathlib import Path

import benchlib
import torch
import torch.distributed.checkpoint as dcp
from benchlib import Column, Table
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

import ftrun.checkpoint as ckpt
from ftrun.checkpoint import device_copy


def build(dim: int, layers: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(
        *(
            nn.TransformerEncoderLayer(
                dim, dim // 128, 4 * dim, dropout=0.0, batch_first=True, norm_first=True
            )
            for _ in range(layers)
        )
    ).cuda()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


class Loop:
    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer, args, dim: int) -> None:
        self.model, self.opt = model, opt
        shape = (args.accum, args.batch, args.context, dim)
        self.x = torch.randn(shape, device="cuda")  # random, never zeros: real work per step
        self.tokens = args.accum * args.batch * args.context

    def step(self) -> None:
        for x in self.x:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = self.model(x).float().square().mean()
            loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


@contextmanager
def pageable_path():
    """The GPU path as it was: no device_copy, so GPU tensors go through the generic copy."""
    devices = device_copy.devices
    device_copy.devices = lambda tensors: []  # type: ignore[assignment]
    try:
        yield
    finally:
        device_copy.devices = devices  # type: ignore[assignment]


class FtrunSaver:
    def __init__(self, root: Path, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        self.job = f"bench-{uuid.uuid4().hex[:8]}"
        # Persisting whenever the worker is free (not every 60 s, the default): the harder case.
        self.mgr = ckpt.Manager(root, job_id=self.job, keep=2, persist_interval=0)
        self.state = {"train": ckpt.TrainState(model, opt)}

    def save(self, step: int) -> None:
        self.mgr.save(step, self.state)

    def held(self) -> float:
        return self.mgr.stats.blocked_s

    def finish(self) -> None:  # the last snapshot is in host memory
        self.mgr.wait_ready()

    def close(self) -> None:
        self.mgr.close(persist_last=False)
        shutil.rmtree(ckpt.memory_tier_dir(self.job), ignore_errors=True)


class DcpSaver:
    def __init__(self, root: Path, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        self.root, self.model, self.opt = root, model, opt
        self.future = None

    def save(self, step: int) -> None:
        self.finish()  # the previous save first: part of this save's stall
        m, o = get_state_dict(
            self.model, self.opt, options=StateDictOptions(flatten_optimizer_state_dict=True)
        )
        path = self.root / "dcp"
        shutil.rmtree(path, ignore_errors=True)
        self.future = dcp.async_save({"model": m, "optim": o}, checkpoint_id=path, no_dist=True)

    def held(self) -> float:
        return 0.0

    def finish(self) -> None:
        if self.future is not None:
            self.future.result()
            self.future = None

    def close(self) -> None:
        self.finish()


def window(loop: Loop, saver, steps: int, every: int, first: int) -> tuple[float, list[float]]:
    """Seconds/step over `steps` steps, saving after step i when i % every == 0, except after the
    last step; and each save() call's time. The last step is there so that every save is followed
    by the optimizer step that waits for it, inside the window, as in training. What is still in
    flight at the end is host-side: a snapshot's manifest, a persist, dcp's write. dcp's write is
    waited for too, since its next save would wait for it (each save's stall includes that)."""
    stalls: list[float] = []
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        held = saver.held() if saver else 0.0
        loop.step()
        if saver is None:
            continue
        if stalls:  # the pageable path holds the optimizer step on the CPU
            stalls[-1] += saver.held() - held
        if i % every == 0 and i < steps - 1:
            s0 = time.perf_counter()
            saver.save(first + i)
            stalls.append(time.perf_counter() - s0)
    if isinstance(saver, DcpSaver):
        s0 = time.perf_counter()
        saver.finish()
        stalls[-1] += time.perf_counter() - s0
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    if saver is not None:
        saver.finish()
    return elapsed / steps, stalls


def copy_rate(saver: FtrunSaver, loop: Loop, step: int) -> float:
    """GB/s of one snapshot on an idle GPU: from save() until the slot is committed."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    saver.save(step)
    saver.finish()
    state = sum(p.numel() for p in loop.model.parameters()) * 12
    return state / (time.perf_counter() - t0) / 1e9


def measure(args: argparse.Namespace, dim: int, root: Path) -> list[dict]:
    model, opt = build(dim, args.layers)
    loop = Loop(model, opt, args, dim)
    loop.step()  # the optimizer state exists from here on
    params = sum(p.numel() for p in model.parameters())
    size = f"{params / 1e6:.0f}M params, {params * 12 / 2**30:.1f} GiB"
    variants = [
        ("ftrun", FtrunSaver, 1, None),
        ("ftrun, pageable", FtrunSaver, 1, pageable_path),
        (f"dcp.async_save/{args.dcp_every}", DcpSaver, args.dcp_every, None),
    ]
    rows = []
    for name, make, every, context in variants:
        if args.only and name.split("/")[0] not in args.only:
            continue
        with context() if context else nullcontext():
            saver = make(root / name.replace(" ", "_").replace("/", "_"), model, opt)
            try:
                window(loop, saver, 3, 1, 10**6)  # warm: buffers allocated, pinned, faulted in
                rate = copy_rate(saver, loop, 2 * 10**6) if isinstance(saver, FtrunSaver) else None
                base, with_saves, stalls = [], [], []
                steps = max(args.steps, 2 * every + 1)
                for r in range(args.rounds):
                    base.append(window(loop, None, steps, 1, 0)[0])
                    t, s = window(loop, saver, steps, every, 1 + 1000 * r)
                    with_saves.append(t)
                    stalls += s
            finally:
                saver.close()
        ratios = [b / w for b, w in zip(base, with_saves, strict=True)]
        rows.append(
            {
                "size": size,
                "variant": name,
                "step_s": statistics.mean(base),
                "tokens": loop.tokens,
                "thru": statistics.mean(base) / statistics.mean(with_saves),
                "median": statistics.median(ratios),
                "stall_ms": 1000 * statistics.median(stalls),
                "saves": len(stalls),
                "gbps": rate,
            }
        )
        print(f"  {rows[-1]}", flush=True)
    del loop, model, opt
    torch.cuda.empty_cache()
    return rows


TABLE = Table(
    [
        Column(key="size", header="model", align="<"),
        Column(key="variant", header="checkpoint", align="<"),
        Column(key="step_s", header="step s (none)", spec=".3f"),
        Column(key="tokens", header="tokens/step", spec="d"),
        Column(key="thru", header="thru vs none", spec=".3f"),
        Column(key="median", header="median round", spec=".3f"),
        Column(key="stall_ms", header="stall/save ms (median)", spec=".1f"),
        Column(key="saves", header="saves", spec="d"),
        Column(key="gbps", header="copy GB/s (idle GPU)", spec=".1f"),
    ],
    name="variant",
    anchor="none",
)


def main() -> None:
    benchlib.exit_on_sigterm()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", type=int, nargs="+", default=[1024, 2048], help="model widths")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--batch", type=int, default=8, help="sequences per micro-batch")
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--accum", type=int, default=4, help="micro-batches per step")
    p.add_argument("--steps", type=int, default=6, help="steps per window")
    p.add_argument("--rounds", type=int, default=3, help="windows of each kind per variant")
    p.add_argument("--dcp-every", type=int, default=5, help="steps between dcp.async_save")
    p.add_argument("--only", nargs="+", choices=["ftrun", "ftrun, pageable", "dcp.async_save"])
    p.add_argument("--json", default=None, help="also write the rows to this file")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_gpu: no CUDA GPU here (torch.cuda.is_available() is False)")
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="bench_gpu."))
    t0 = time.monotonic()
    try:
        rows = [row for dim in args.dims for row in measure(args, dim, root)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print()
    print(TABLE.render([{"variant": "none", "thru": 1.0}, *rows]))
    print(f"({time.monotonic() - t0:.0f} s)")
    if args.json:
        benchlib.write_json(args.json, {"rows": rows})


if __name__ == "__main__":
    main()
