"""Crash-consistency trials: SIGKILL a saving process at random moments, then restore and check.

One chain of trials shares a checkpoint directory and a memory tier, like a job that keeps
crashing. Each trial forks a child (torch already imported here, nothing run in parallel before
the fork) that restores, checks that what it got is one complete step, then saves steps as fast
as it can. After a random delay the parent SIGKILLs, at random, the child alone (its persist
worker follows via PDEATHSIG), the child and its worker at once, or only the worker. A restored
state is complete when every tensor holds exactly its step's pattern and the pickled step matches.
The restored step must never go backwards across trials, except after every fourth trial, where
the memory tier is deleted first (as if the host restarted) and storage alone must serve the
restore. At the end, both the freshest tier and storage alone are checked once more.

Prints one JSON line per trial and a summary line; exits 1 if any check failed.
"""

import argparse
import json
import os
import random
import shutil
import signal
import sys
import time
import uuid

import psutil
import torch

import ftrun.checkpoint as ckpt

N_TENSORS = 4


def make_state(mib: float) -> dict:
    numel = max(1, int(mib * 2**20 / 4 / N_TENSORS))
    tensors = {f"w{i}": torch.zeros(numel) for i in range(N_TENSORS)}
    tensors["small"] = torch.zeros(3)
    state = {"model": tensors, "meta": {"step": 0}}
    fill(state, 0)
    return state


def fill(state: dict, step: int) -> None:
    for i, t in enumerate(state["model"].values()):
        t.fill_(float(step * 10 + i))
    state["meta"]["step"] = step


def complete(state: dict) -> int | None:
    """The step the state holds, or None if it mixes steps (a torn snapshot)."""
    step = state["meta"]["step"]
    for i, t in enumerate(state["model"].values()):
        if not torch.all(t == float(step * 10 + i)):
            return None
    return step


def child(args: argparse.Namespace, job: str, ready_w: int, result_w: int, memory: bool) -> None:
    os.setsid()
    torch.set_num_threads(1)
    state = make_state(args.state_mib)
    # persist_interval=0: persist whenever the worker is free, so that kills land in commits
    mgr = ckpt.Manager(args.dir, job_id=job, memory=memory, keep=2, persist_interval=0)
    step = mgr.restore(state)
    got = complete(state)
    report = {
        "restored": step,
        "tier": mgr.restored.tier,
        "complete": got == step,
        "worker": mgr._client.proc.pid,
    }
    os.write(result_w, (json.dumps(report) + "\n").encode())
    if args.check_only:
        mgr.close(persist_last=False)
        os._exit(0)
    os.write(ready_w, b"x")
    try:
        while True:
            step += 1
            mgr.wait_snapshot()
            fill(state, step)
            mgr.save(step, state)
    except ckpt.CheckpointError:  # its worker was killed: the next save says so
        os._exit(4)


def run_trial(
    args: argparse.Namespace, job: str, rng: random.Random, memory: bool = True, kill: bool = True
) -> dict:
    ready_r, ready_w = os.pipe()
    result_r, result_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            os.close(result_r)
            child(args, job, ready_w, result_w, memory)
        finally:
            os._exit(3)
    os.close(ready_w)
    os.close(result_w)
    mode, delay = None, None
    try:
        with os.fdopen(result_r) as results:
            line = results.readline()
            report = json.loads(line) if line else {"error": "child died before restoring"}
            if kill and "error" not in report and os.read(ready_r, 1):
                mode = rng.choice(["rank", "group", "worker"])
                delay = rng.uniform(0.0, args.max_delay_s)
                time.sleep(delay)  # a random fault time, not a synchronisation
                if mode == "rank":
                    os.kill(pid, signal.SIGKILL)
                elif mode == "group":
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(report["worker"], signal.SIGKILL)
    finally:
        os.close(ready_r)
        _reap(pid)
    return {**report, "kill": mode, "delay_s": None if delay is None else round(delay, 3)}


def _reap(pid: int) -> None:
    """The child dies (killed, or by its worker's death); make sure its group is gone."""
    deadline = time.monotonic() + 10
    while True:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if not done:
        os.waitpid(pid, 0)
    for proc in psutil.process_iter():  # the worker, if it outlived the group
        try:
            if (
                proc.ppid() == 1
                and "ftrun.checkpoint.worker" in " ".join(proc.cmdline())
                and f"--parent {pid}" in " ".join(proc.cmdline())
            ):
                proc.kill()
        except psutil.Error:
            continue


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=50)
    p.add_argument("--state-mib", type=float, default=64.0)
    p.add_argument("--max-delay-s", type=float, default=1.0)
    p.add_argument("--dir", default=None, help="default: a fresh temporary directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--job", default=None, help="memory-tier job id (default: a fresh one)")
    p.add_argument("--check-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    own_dir = args.dir is None
    args.dir = args.dir or f"/tmp/ftrun-crash-{uuid.uuid4().hex[:8]}"
    job = args.job or f"crash-{uuid.uuid4().hex[:8]}"
    rng = random.Random(args.seed)
    failures, last, tiers = [], 0, {}
    try:
        for i in range(args.trials):
            lost = i % 4 == 3  # as if the host restarted: the memory tier is gone
            if lost:
                shutil.rmtree(ckpt.memory_tier_dir(job), ignore_errors=True)
            rec = run_trial(args, job, rng)
            rec["trial"], rec["memory_lost"] = i, lost
            if "error" in rec or not rec["complete"] or (rec["restored"] < last and not lost):
                failures.append(rec)
            else:
                last = rec["restored"]
                tiers[rec["tier"]] = tiers.get(rec["tier"], 0) + 1
            print(json.dumps(rec), flush=True)
        args.check_only = True
        for memory in (True, False):  # the final state, from the freshest tier and from storage
            rec = run_trial(args, job, rng, memory=memory, kill=False)
            rec["trial"] = f"final-{'any' if memory else 'storage'}"
            if "error" in rec or not rec["complete"] or (memory and rec["restored"] < last):
                failures.append(rec)
            print(json.dumps(rec), flush=True)
    finally:
        shutil.rmtree(ckpt.memory_tier_dir(job), ignore_errors=True)
        if own_dir:
            shutil.rmtree(args.dir, ignore_errors=True)
    print(
        json.dumps(
            {
                "summary": True,
                "trials": args.trials,
                "failures": len(failures),
                "tiers": tiers,
                "last_step": last,
            }
        ),
        flush=True,
    )
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
