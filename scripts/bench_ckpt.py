"""Checkpoint benchmark: stall and throughput of torch.save, dcp.save, dcp.async_save and ftrun.

    python scripts/bench_ckpt.py [--state-gib 4.5] [--crash-trials 1] [--crash-only] [--crash-all]

One process, one rank, one model (a stack of bias-free Linear layers sized so that parameters +
AdamW state = --state-gib), measured side by side in one run, under the glibc tunables an ftrun
agent gives its ranks (benchlib.start_as_ranks_do; --glibc-default for glibc's own):

- stall per checkpoint: wall time the training loop is held by checkpointing. Synchronous
  methods: the save call. dcp.async_save: the call (staging) + waiting for the previous save's
  future before the next one. ftrun: save() + the time the optimizer pre-step hook waits for the
  snapshot copy (Manager.stats.blocked_s). Two figures: the median with a checkpoint every step
  (back-to-back torch.save calls also wait for the previous one's dirty pages), and one
  checkpoint alone (in the every-10 window). The last line uses the larger of the two ratios.
- throughput: steps per second relative to no checkpointing, measured in windows that alternate
  with no-checkpoint windows (the machine is shared: a ratio is only meaningful next to its
  baseline). (a) A checkpoint after every step, steady state: work still in flight when the
  window ends finishes untimed before the next baseline. ftrun snapshots every step to memory
  and persists whenever its worker is free (one in flight, at --persist-bandwidth): the table
  says how many snapshots reached storage. (b) One checkpoint per 10 steps: the window also
  waits for that checkpoint's background work, so nothing is left out.
- crash corpus (crash_corpus.py): state shapes x kill moments x load (idle, beside `stress-ng
  --cpu 2`), each a SIGKILL at a chosen moment then a restore in a fresh process, compared bit
  for bit with an uninterrupted run: wrong restores, steps lost, tier used. By default every
  shape x moment idle and every shape killed in its forward pass under stress, --crash-trials
  (1) each (~10 minutes on the 2-core VM); --crash-all: every moment under stress too;
  --shapes/--moments/--loads narrow it; --live on|off sets the Manager's live_snapshot (else its
  default); --crash-only skips the throughput part;
  --crash-trials 0 skips the corpus.

Prints a table, then as its last line `stall ratio ftrun/torch.save: X`.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
import uuid
from pathlib import Path

import benchlib
import crash_corpus
import torch
import torch.distributed.checkpoint as dcp
from benchlib import Column, Table
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

import ftrun.checkpoint as ckpt

REPO = Path(__file__).resolve().parent.parent
WIDTH = 4096


def build(state_gib: float) -> tuple[torch.nn.Module, torch.optim.Optimizer, int]:
    layers = max(1, round(state_gib * 2**30 / 12 / WIDTH**2))  # fp32 param + exp_avg + exp_avg_sq
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    return model, opt, layers


class Loop:
    """The training step; `x` is fixed so every method does the same work."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer, batch: int) -> None:
        self.model, self.opt = model, opt
        self.x = torch.randn(batch, WIDTH)

    def step(self) -> None:
        loss = self.model(self.x).square().mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()


class Method:
    name = ""

    def __init__(self, root: Path, model, opt) -> None:
        self.root, self.model, self.opt = root, model, opt
        self.seq = 0

    def save(self, step: int) -> None:  # returns when the training loop may continue
        raise NotImplementedError

    def drain(self) -> None:  # wait for anything still in flight
        pass

    def blocked(self) -> float:
        """Seconds the training loop was held outside save() since the last call."""
        return 0.0

    def settle(self) -> float:
        """Block until the training loop could mutate the state again; returns the seconds."""
        return 0.0

    def ready(self) -> None:
        """End of warm-up: one-time allocations are done."""

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def note(self) -> str:
        return ""


class TorchSave(Method):
    name = "torch.save"

    def save(self, step: int) -> None:
        path = self.root / f"ckpt-{step}.pt"
        self.root.mkdir(parents=True, exist_ok=True)
        torch.save({"model": self.model.state_dict(), "optim": self.opt.state_dict()}, path)
        for old in self.root.glob("ckpt-*.pt"):
            if old != path:
                old.unlink()


class DcpSave(Method):
    name = "dcp.save"

    def state(self) -> dict:
        m, o = get_state_dict(
            self.model, self.opt, options=StateDictOptions(flatten_optimizer_state_dict=True)
        )
        return {"model": m, "optim": o}

    def save(self, step: int) -> None:
        path = self.root / f"step-{step}"
        dcp.save(self.state(), checkpoint_id=path, no_dist=True)
        self._prune(path)

    def _prune(self, keep: Path) -> None:
        for old in self.root.glob("step-*"):
            if old != keep:
                shutil.rmtree(old, ignore_errors=True)


class DcpAsyncSave(DcpSave):
    name = "dcp.async_save"

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.future = None
        self.path: Path | None = None

    def save(self, step: int) -> None:
        self.drain()  # the previous save must finish first (as torchtitan does): a stall
        self.path = self.root / f"step-{step}"
        self.future = dcp.async_save(self.state(), checkpoint_id=self.path, no_dist=True)

    def drain(self) -> None:
        if self.future is not None:
            self.future.result()
            self.future = None
            assert self.path is not None
            self._prune(self.path)


class Ftrun(Method):
    name = "ftrun"

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.job = f"bench-{uuid.uuid4().hex[:8]}"
        self.mgr = self.make_manager()
        self.state = {"train": ckpt.TrainState(self.model, self.opt)}
        self._blocked = 0.0

    def make_manager(self) -> ckpt.Manager:  # bench_throughput.py varies its options
        # Persisting whenever the worker is free (not every 60 s, the default): the anchor,
        # torch.save, writes every save.
        return ckpt.Manager(self.root, job_id=self.job, keep=2, persist_interval=0)

    def save(self, step: int) -> None:
        self.mgr.save(step, self.state)

    def blocked(self) -> float:  # the optimizer pre-step hook waiting for the snapshot copy
        now = self.mgr.stats.blocked_s
        delta, self._blocked = now - self._blocked, now
        return delta

    def settle(self) -> float:
        t0 = time.perf_counter()
        self.mgr.wait_snapshot()
        self.blocked()
        return time.perf_counter() - t0

    def drain(self) -> None:
        self.mgr.wait_persist()
        self.blocked()

    def ready(self) -> None:  # both snapshot buffers allocated and faulted in
        self.mgr.wait_ready()
        self.blocked()

    def note(self) -> str:
        s = self.mgr.stats
        return f"{s.persisted} of {s.saves} snapshots persisted to storage"

    def close(self) -> None:
        self.mgr.close(persist_last=False)
        shutil.rmtree(ckpt.memory_tier_dir(self.job), ignore_errors=True)
        super().close()


def timed_window(
    loop: Loop,
    method: Method | None,
    steps: int,
    every: int,
    first: int,
    stalls: list[float] | None,
    *,
    drain: bool,
) -> float:
    """Run `steps` steps, checkpointing after step i when i % every == 0; returns seconds/step.

    A checkpoint's stall is its save() call plus the time the following step was held for it
    (the last one: the time until the state may change again, an upper bound). With `drain`, the
    window also waits for its checkpoints' background work (a persist, a future) to finish.
    """
    t0 = time.perf_counter()
    for i in range(steps):
        loop.step()
        if method is None:
            continue
        held = method.blocked()
        if stalls:
            stalls[-1] += held
        if i % every == 0:
            s0 = time.perf_counter()
            method.save(first + i)
            if stalls is not None:
                stalls.append(time.perf_counter() - s0)
            method.blocked()  # waits inside save() are already in its time
    if method is not None:
        settled = method.settle()
        if stalls:
            stalls[-1] += settled
        if drain:
            method.drain()
    return (time.perf_counter() - t0) / steps


def run(args: argparse.Namespace) -> None:
    model, opt, layers = build(args.state_gib)
    params = sum(p.numel() for p in model.parameters())
    loop = Loop(model, opt, args.batch)
    loop.step()  # allocate optimizer state
    state_gib = params * 12 / 2**30
    print(
        f"model: {layers} x Linear({WIDTH}, {WIDTH}) = {params / 1e6:.0f} M parameters; "
        f"state (params + AdamW) = {state_gib:.2f} GiB; batch {args.batch}; "
        f"{torch.get_num_threads()} threads",
        flush=True,
    )
    rows = []
    root = Path(args.dir)
    for cls in (TorchSave, DcpSave, DcpAsyncSave, Ftrun):
        if args.methods and cls.name not in args.methods:
            continue
        method = cls(root / cls.name.replace(".", "_"), model, opt)
        base, every1, stalls = [], [], []
        try:
            method.save(0)  # warm-up (first-time allocations), not measured
            method.settle()
            method.drain()
            method.ready()
            # The machine is shared and noisy: baseline windows alternate with this method's.
            # Every-step windows measure the steady state: background work still running at
            # their end continues, untimed, before the next baseline (as it would in training).
            for r in range(args.rounds):
                base.append(timed_window(loop, None, args.steps_base, 1, 0, None, drain=False))
                every1.append(
                    timed_window(
                        loop, method, args.steps_every1, 1, 1 + 100 * r, stalls, drain=False
                    )
                )
                method.drain()
            note = method.note()
            # Every-10 window: one checkpoint, and the window owns all of its background work.
            base.append(timed_window(loop, None, args.steps_base, 1, 0, None, drain=False))
            alone: list[float] = []  # the stall of one checkpoint with nothing before it
            every10 = timed_window(loop, method, 10, 10, 1000, alone, drain=True)
            base.append(timed_window(loop, None, args.steps_base, 1, 0, None, drain=False))
        finally:
            method.close()
        mean_base = statistics.mean(base)
        row = {
            "method": cls.name,
            "stall_s": statistics.median(stalls),
            "stall_max_s": max(stalls),
            "stall10_s": alone[0],
            "thru1": mean_base / statistics.mean(every1),
            "thru10": mean_base / every10,
            "base_s": mean_base,
            "note": note,
        }
        rows.append(row)
        print(
            f"  {cls.name}: stall median {row['stall_s']:.3f} s, max {row['stall_max_s']:.3f} s "
            f"({len(stalls)} checkpoints), alone {row['stall10_s']:.3f} s; s/step: none {' '.join(f'{b:.2f}' for b in base)}, "
            f"every step {' '.join(f'{e:.2f}' for e in every1)}, every 10 {every10:.2f}; {note}",
            flush=True,
        )
    table(rows, state_gib, args)


def run_corpus(args: argparse.Namespace) -> None:
    """The crash corpus (crash_corpus.py); prints its table. By default only the forward pass
    under stress: the full matrix takes ~25 minutes on the 2-core VM."""
    narrow = not args.crash_all and not args.moments
    crash_corpus.corpus(
        trials=args.crash_trials,
        shapes=args.shapes or list(crash_corpus.SHAPES),
        moments=args.moments or crash_corpus.MOMENTS,
        loads=args.loads or crash_corpus.LOADS,
        stress_moments=("forward",) if narrow else None,
        options={} if args.live is None else {"live_snapshot": args.live == "on"},
    )


TABLE = Table(
    [
        Column(key="method", header="method", align="<"),
        Column(key="stall_s", header="stall every step s", spec=".3f", ratio=".4f"),
        Column(key="stall10_s", header="stall alone s", spec=".3f", ratio=".4f"),
        Column(key="thru1", header="thru every step", spec=".3f"),
        Column(key="thru10", header="thru every 10", spec=".3f"),
        Column(key="note", header="notes", align="<"),
    ],
    name="method",
    anchor="torch.save",
)


def table(rows: list[dict], state_gib: float, args: argparse.Namespace) -> None:
    base = statistics.mean(r["base_s"] for r in rows)
    print()
    print(
        f"state {state_gib:.2f} GiB, batch {args.batch}, no-checkpoint step {base:.2f} s "
        f"(mean of the baselines)"
    )
    print(
        "stall = seconds the training loop is held per checkpoint: median with a checkpoint "
        "every step, and for one checkpoint alone (every 10); thru = steps/s relative to none"
    )
    print(TABLE.render([{"method": "none", "thru1": 1.0, "thru10": 1.0, "note": ""}, *rows]))
    by = {r["method"]: r for r in rows}
    ref, ours = by.get("torch.save"), by.get("ftrun")
    if ref and ours:
        # The larger (less favourable) of the two ratios.
        ratios = [benchlib.ratio(ours[k], ref[k]) for k in ("stall_s", "stall10_s")]
        if None not in ratios:
            print(f"stall ratio ftrun/torch.save: {max(ratios):.4f}")


def main() -> None:
    benchlib.exit_on_sigterm()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--state-gib", type=float, default=4.5)
    p.add_argument("--batch", type=int, default=256, help="rows per step (sets the step time)")
    p.add_argument("--steps-base", type=int, default=3, help="steps per baseline window")
    p.add_argument("--steps-every1", type=int, default=4, help="steps per every-step window")
    p.add_argument("--rounds", type=int, default=2, help="every-step windows (with baselines)")
    p.add_argument("--methods", nargs="*", default=None)
    p.add_argument("--crash-trials", type=int, default=1, help="per corpus cell; 0: no corpus")
    p.add_argument("--crash-only", action="store_true", help="the corpus alone, no throughput")
    p.add_argument("--crash-all", action="store_true", help="every moment under stress too")
    p.add_argument("--shapes", nargs="*", choices=list(crash_corpus.SHAPES), default=None)
    p.add_argument("--moments", nargs="*", choices=crash_corpus.MOMENTS, default=None)
    p.add_argument("--loads", nargs="*", choices=crash_corpus.LOADS, default=None)
    p.add_argument("--live", choices=("on", "off"), default=None, help="the corpus's live_snapshot")
    p.add_argument("--dir", default=None, help="storage for the checkpoints (default: a temp dir)")
    benchlib.add_glibc_default_flag(p)
    args = p.parse_args()
    benchlib.start_as_ranks_do(args)
    own = args.dir is None
    args.dir = args.dir or f"/tmp/ftrun-bench-{uuid.uuid4().hex[:8]}"
    try:
        if not args.crash_only:
            run(args)
        if args.crash_trials:
            run_corpus(args)
    finally:
        if own:
            shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
