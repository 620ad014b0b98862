"""The crash corpus: is every restore one saved step, bit for bit, and how many steps are lost?

For each state shape (corpus_shapes.py) x kill moment x load, a run trains with an
ftrun.checkpoint Manager (memory tier; the live snapshot as the Manager defaults, or as
`--live` says; a persist every 3rd step), is SIGKILLed at step 7 at the moment named, and a fresh run (a restart in place: same host,
same memory tier) restores. The restored state is compared with an uninterrupted run's at the
step the restore names, every tensor and the step counter, by SHA-256: a mismatch is a *wrong
restore*. *Steps lost* is the last step whose save() returned (6) minus the step restored.
*Checks failed*: trials whose restore skipped a newer snapshot that failed its check (the
sampled digest, ftrun/checkpoint/sample_digest.py) for an older one.

Moments (on the last rank; the other ranks of a 2-rank job are killed when it dies, as a
restart in place does):
  forward    in the forward pass of step 7 (a forward pre-hook of the first layer)
  backward   in the backward pass of step 7 (a gradient hook of the first parameter)
  optimizer  inside optimizer.step() of step 7 (a timer set to half the median step time)
  save       inside save(7) (while its values are pickled)
  persist    right after save(6) returned, while its persist is being written

Loads: idle, and beside `stress-ng --cpu 2` (the busy machine the issue's audit used).

Ranks are forked from this process (torch imported once, no thread started before the fork),
each into its own log under the run's temp directory; a trial's memory tier and storage are
removed after it.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import corpus_shapes
import torch
from benchlib import Column, Table
from corpus_shapes import SHAPES, Hooks, Shape

import ftrun.checkpoint as ckpt

MOMENTS = ("forward", "backward", "optimizer", "save", "persist")
LOADS = ("idle", "stress")
KILL_STEP = 7
PERSIST_EVERY = 3
LAST_SAVED = 6  # the last step whose save() returned before any kill
RUN_TIMEOUT_S = 180.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(world: int, target: Callable[[int, int], None], log_dir: Path, tag: str) -> list[int]:
    """Fork `world` ranks running target(rank, world); when one is SIGKILLed, SIGKILL the rest
    (a restart in place). Returns each rank's wait status."""
    port = _free_port()
    pids = []
    for rank in range(world):
        pid = os.fork()
        if pid == 0:  # the rank
            code = 1
            try:
                os.setsid()
                fd = os.open(log_dir / f"{tag}-r{rank}.log", os.O_WRONLY | os.O_CREAT, 0o600)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.environ.update(
                    RANK=str(rank),
                    LOCAL_RANK=str(rank),
                    WORLD_SIZE=str(world),
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port),
                )
                if world > 1:
                    torch.distributed.init_process_group("gloo")
                target(rank, world)
                code = 0
            except BaseException:  # noqa: BLE001 - the rank's own log says what
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        pids.append(pid)
    statuses: dict[int, int] = {}
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while len(statuses) < world:
        for rank, pid in enumerate(pids):
            if rank in statuses:
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                statuses[rank] = status
                if os.WIFSIGNALED(status) or time.monotonic() > deadline:
                    for other, opid in enumerate(pids):
                        if other not in statuses:
                            _kill_group(opid)
        if time.monotonic() > deadline:
            for rank, pid in enumerate(pids):
                if rank not in statuses:
                    _kill_group(pid)
        time.sleep(0.01)
    return [statuses[r] for r in range(world)]


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class Killer:
    """A plain value of the state: pickling it inside save() kills the rank once armed."""

    armed = False

    def __getstate__(self) -> dict[str, Any]:
        if Killer.armed:
            die()
        return {}


def arm(shape: Shape, moment: str, hooks: Hooks, step: list[int]) -> None:
    """Make the rank die at `moment` of step KILL_STEP (or after save(LAST_SAVED): persist)."""
    if moment == "forward":
        first = next(m for m in shape.model.modules() if list(m.parameters(recurse=False)))
        first.register_forward_pre_hook(lambda *_: die() if step[0] == KILL_STEP else None)
    elif moment == "backward":
        param = next(iter(shape.model.parameters()))
        param.register_hook(lambda g: die() if step[0] == KILL_STEP else g)
    elif moment == "optimizer":
        took: list[float] = []
        began = [0.0]

        def pre(*_: Any) -> None:  # runs after ftrun's own pre-step hook (attached at restore)
            began[0] = time.perf_counter()
            if step[0] == KILL_STEP:
                delay = statistics.median(took) / 2 if took else 0.0
                threading.Timer(delay, die).start()

        def post(*_: Any) -> None:
            took.append(time.perf_counter() - began[0])
            if step[0] == KILL_STEP:
                time.sleep(5)  # the timer fires inside the step, or here at its very end

        shape.opt.register_step_pre_hook(pre)
        shape.opt.register_step_post_hook(post)
    elif moment == "save":
        shape.extra["killer"] = Killer()


def reference_run(name: str, directory: Path, out: Path) -> Callable[[int, int], None]:
    def rank_main(rank: int, world: int) -> None:
        shape = SHAPES[name](rank, world)
        mgr = ckpt.Manager(directory / f"ref-{rank}", memory=False)
        try:
            mgr.restore(shape.state())  # as every run does: DCP makes the optimizer state here
            digests = [shape.digest()]
            hooks = Hooks()
            for n in range(1, KILL_STEP + 1):
                shape.step(n, hooks)
                digests.append(shape.digest())
                shape.after_save(n, hooks)
        finally:
            mgr.close(persist_last=False)
        (out / f"ref-r{rank}.json").write_text(json.dumps(digests))

    return rank_main


def crash_run(
    name: str, moment: str, job: str, directory: Path, options: dict[str, Any]
) -> Callable[[int, int], None]:
    def rank_main(rank: int, world: int) -> None:
        shape = SHAPES[name](rank, world)
        mgr = ckpt.Manager(
            directory, job_id=job, persist_every=PERSIST_EVERY, persist_interval=0, **options
        )
        state = shape.state()
        mgr.restore(state)
        hooks, step = Hooks(), [0]
        if rank == world - 1:
            arm(shape, moment, hooks, step)
        for n in range(1, KILL_STEP + 1):
            step[0] = n
            shape.step(n, hooks)
            Killer.armed = moment == "save" and n == KILL_STEP and rank == world - 1
            mgr.save(n, state)
            if moment == "persist" and n == LAST_SAVED and rank == world - 1:
                die()
            shape.after_save(n, hooks)
        time.sleep(RUN_TIMEOUT_S)  # not reached on the killed rank; the others wait to be killed

    return rank_main


def restore_run(
    name: str, job: str, directory: Path, out: Path, options: dict[str, Any]
) -> Callable[[int, int], None]:
    def rank_main(rank: int, world: int) -> None:
        shape = SHAPES[name](rank, world)
        mgr = ckpt.Manager(directory, job_id=job, persist_every=10**9, **options)
        try:
            step = mgr.restore(shape.state())
            got = mgr.restored
            assert got is not None
            result = {
                "step": step,
                "tier": got.tier,
                "path": got.path,
                "digest": shape.digest(),
                "skipped": list(got.skipped),
            }
        finally:
            mgr.close(persist_last=False)
        (out / f"restored-r{rank}.json").write_text(json.dumps(result))

    return rank_main


def tier_label(result: dict[str, Any]) -> str:
    path = result.get("path") or ""
    if result["tier"] == "memory":
        return "memory (live)" if path.endswith("live.json") else "memory (copy)"
    return str(result["tier"])


def trial(
    name: str, moment: str, work: Path, refs: list[list[str]], options: dict[str, Any]
) -> dict[str, Any]:
    world = corpus_shapes.world_of(name)
    job = f"corpus-{uuid.uuid4().hex[:8]}"
    directory = work / job
    out = work / f"{job}-out"
    out.mkdir()
    try:
        crash = crash_run(name, moment, job, directory, options)
        run_ranks(world, crash, work, f"{job}-crash")
        restore = restore_run(name, job, directory, out, options)
        statuses = run_ranks(world, restore, work, f"{job}-restore")
        results = []
        for rank in range(world):
            path = out / f"restored-r{rank}.json"
            if not path.exists():
                return {"error": f"the restore failed (status {statuses[rank]}), see {work}"}
            results.append(json.loads(path.read_text()))
        step = results[0]["step"]
        wrong = any(r["digest"] != refs[rank][r["step"]] for rank, r in enumerate(results))
        return {
            "step": step,
            "wrong": wrong,
            "lost": LAST_SAVED - step,
            "tier": tier_label(results[0]),
            "skipped": results[0]["skipped"],
        }
    finally:
        shutil.rmtree(ckpt.memory_tier_dir(job), ignore_errors=True)
        shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)


class Stress:
    """`stress-ng --cpu 2` beside the trials, in its own session; stopped on exit."""

    def __init__(self, load: str) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        if load == "stress":
            self.proc = subprocess.Popen(
                ["stress-ng", "--cpu", "2", "--quiet"],
                start_new_session=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

    def __enter__(self) -> Stress:
        return self

    def __exit__(self, *_: object) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)


TABLE = Table(
    [
        Column(key="shape", header="shape", align="<"),
        Column(key="moment", header="moment", align="<"),
        Column(key="load", header="load", align="<"),
        Column(key="trials", header="trials"),
        Column(key="wrong", header="wrong restores"),
        Column(key="lost", header="steps lost", align="<"),
        Column(key="tier", header="tier used", align="<"),
        Column(key="caught", header="checks failed", align="<"),
    ],
    name="shape",
)


def corpus(
    *,
    trials: int,
    shapes: Sequence[str] = tuple(SHAPES),
    moments: Sequence[str] = MOMENTS,
    loads: Sequence[str] = LOADS,
    stress_moments: Sequence[str] | None = None,
    options: dict[str, Any] | None = None,
    keep_logs: bool = False,
) -> list[dict[str, Any]]:
    """Run the corpus and print its table; returns the rows. `stress_moments`: the moments
    under stress, when not all of `moments`; `options`: the Manager's (e.g. live_snapshot)."""
    options = options or {}
    work = Path(tempfile.mkdtemp(prefix="ftrun-corpus-"))
    rows: list[dict[str, Any]] = []
    try:
        for load in loads:
            with Stress(load):
                for name in shapes:
                    ref_out = work / f"ref-{uuid.uuid4().hex[:6]}"
                    ref_out.mkdir()
                    world = corpus_shapes.world_of(name)
                    run_ranks(world, reference_run(name, ref_out, ref_out), work, ref_out.name)
                    refs = [
                        json.loads((ref_out / f"ref-r{r}.json").read_text()) for r in range(world)
                    ]
                    narrow = load == "stress" and stress_moments is not None
                    for moment in stress_moments if narrow else moments:
                        done = [trial(name, moment, work, refs, options) for _ in range(trials)]
                        row = summarize(name, moment, load, done)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
        print()
        print(
            f"crash corpus: SIGKILL at step {KILL_STEP} (persist: after save({LAST_SAVED})), "
            f"a persist every {PERSIST_EVERY} steps, Manager options {options or 'default'}; "
            "wrong = the restored "
            "state differs from the uninterrupted run's at the step restored; steps lost = "
            f"{LAST_SAVED} - the step restored"
        )
        print(TABLE.render(rows))
        total = sum(r["trials"] for r in rows)
        wrong = sum(r["wrong"] for r in rows if isinstance(r["wrong"], int))
        print(f"wrong restores: {wrong} of {total} trials")
    finally:
        if keep_logs:
            print(f"logs: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return rows


def summarize(name: str, moment: str, load: str, done: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [d for d in done if "error" not in d]
    errors = [d["error"] for d in done if "error" in d]
    lost = sorted(d["lost"] for d in ok)
    tiers = collections.Counter(d["tier"] for d in ok)
    caught = sum(any("is not used" in why for why in d["skipped"]) for d in ok)
    lost_text = (
        "-" if not lost else str(lost[0]) if lost[0] == lost[-1] else f"{lost[0]}-{lost[-1]}"
    )
    return {
        "shape": name,
        "moment": moment,
        "load": load,
        "trials": len(done),
        "wrong": sum(d["wrong"] for d in ok) + len(errors),
        "caught": f"{caught} of {len(ok)}",
        "lost": lost_text,
        "tier": ", ".join(f"{t} {n}" for t, n in tiers.most_common())
        + (f"; {len(errors)} failed: {errors[0]}" if errors else ""),
    }
