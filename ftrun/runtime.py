"""The runtime library for ranks: report progress and declared sections to the local agent.

`ftrun.step(n)` costs one non-blocking datagram (a few microseconds), never blocks, never raises
into training, and does nothing when the script runs outside ftrun (plain python or torchrun).
`with ftrun.section("checkpoint", timeout_s=300): ...` tells the agent that the steps pause on
purpose, with an allowance of their own, so a long save or eval is not mistaken for a hang.

On first use it also registers `faulthandler` on STACKS_SIGNAL, so that before a hung rank is
killed the agent can make it print every thread's Python stack into its log.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import socket
import sys
from collections.abc import Iterator, Sequence

from ftrun.envcontract import AGENT_SOCK, GENERATION

RESTORE_SKIPPED_MAX, RESTORE_SKIPPED_LEN = 4, 300  # what a restore's datagram carries of why

# Not SIGUSR1/SIGUSR2: those are what scripts use for preemption notices (Lightning, submitit,
# `--signal` under Slurm), and a stack dump must never take a script's own signal.
STACKS_SIGNAL = int(signal.SIGRTMIN) + 2
_UNSET = object()
_target: object = _UNSET  # (socket, path, generation, rank) once resolved, or None outside ftrun
_open_sections: list[dict] = []  # the sections this process is inside, innermost last


def _resolve() -> object:
    path = os.environ.get(AGENT_SOCK)
    if not path:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setblocking(False)
    register_stack_dumps()
    return (sock, path, int(os.environ.get(GENERATION, "0")), int(os.environ.get("RANK", "0")))


def register_stack_dumps() -> None:
    """Print all threads' stacks to stderr on STACKS_SIGNAL (idempotent)."""
    try:
        faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True, chain=False)
    except (ValueError, RuntimeError, OSError, AttributeError):
        pass  # stderr has no file descriptor, or the platform lacks it: no stacks, no harm


def _where() -> tuple[socket.socket, str, int, int] | None:
    """The agent's socket and this rank's identity, resolved once; None outside ftrun."""
    global _target
    if _target is _UNSET:
        _target = _resolve()
    return _target  # type: ignore[return-value]


def step(n: int) -> None:
    """Report that this rank finished training step n (call it once per step)."""
    try:
        if (target := _where()) is not None:
            sock, path, gen, rank = target
            sock.sendto(b'{"e":"step","g":%d,"r":%d,"s":%d}' % (gen, rank, int(n)), path)
    except Exception:  # noqa: BLE001 - progress reporting must never break training
        pass


def _send(event: dict) -> None:
    try:
        if (target := _where()) is not None:
            sock, path, gen, rank = target
            sock.sendto(json.dumps({**event, "g": gen, "r": rank}).encode(), path)
    except Exception:  # noqa: BLE001 - likewise
        pass


def checkpoint_committed(step: int, *, preempt: bool = False) -> None:
    """Tell the agent that the checkpoint of `step` is committed to storage (ftrun.checkpoint
    calls it on rank 0 after every commit; `preempt` when a preemption notice made it persist at
    once, which is what the controller's preemption wait is waiting for)."""
    _send({"e": "ckpt", "s": int(step), "p": bool(preempt)})


def checkpoint_stall(seconds: float) -> None:
    """This rank's training thread has spent `seconds` in all, this generation, blocked on
    checkpoints (ftrun.checkpoint's save() and snapshot waits): a badput bucket of goodput."""
    _send({"e": "stall", "v": round(float(seconds), 6)})


def checkpoint_restored(step: int, tier: str, seconds: float, skipped: Sequence[str] = ()) -> None:
    """Tell the agent what this generation restored (step, memory|storage|none) and how long the
    restore took, so goodput can tell restore from relaunch; `skipped`: why the newer candidates
    were not used (a failed check, a rejected step; the first few, cut short)."""
    event = {"e": "restored", "s": int(step), "tier": str(tier)[:16], "d": round(float(seconds), 6)}
    if skipped:
        event["x"] = [str(why)[:RESTORE_SKIPPED_LEN] for why in skipped[:RESTORE_SKIPPED_MAX]]
    _send(event)


def checkpoint_tier(level: str, before: str, why: str, *, need: int, free: int, total: int) -> None:
    """Tell the agent that this rank's checkpoint memory tier stepped down (live, copies,
    storage: ftrun/checkpoint/capacity.py), why, and the figures in bytes (-1: unknown)."""
    _send(
        {
            "e": "tier",
            "tier": str(level)[:16],
            "from": str(before)[:16],
            "why": str(why)[:400],
            "need": int(need),
            "free": int(free),
            "total": int(total),
        }
    )


def code_done() -> None:
    """Tell the agent this rank's code has returned or raised: what follows is interpreter
    finalization, not training, so step-based hang detection stands down for it. Called by
    the warm start (ftrun/agent/as_main.py), not by scripts."""
    _send({"e": "finishing"})


@contextlib.contextmanager
def section(name: str, timeout_s: float | None = None) -> Iterator[None]:
    """A stretch without steps (checkpoint, eval) with its own hang allowance; None = no limit.

    Sections nest: leaving an inner one declares the outer one again (its allowance starts
    over), so `mgr.close()`, which declares its own, inside `with ftrun.section("final save")`
    does not end the outer section early."""
    begin = {"e": "section", "name": str(name)[:64], "timeout": timeout_s, "begin": True}
    _send(begin)
    _open_sections.append(begin)
    try:
        yield
    finally:
        _open_sections.remove(begin)
        if _open_sections:
            _send(_open_sections[-1])
        else:
            _send({"e": "section", "name": str(name)[:64], "begin": False})
