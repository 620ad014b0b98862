"""Stacks of hung ranks, taken before they are killed.

Two sources: the rank's own faulthandler (registered on STACKS_SIGNAL by ftrun.runtime and by the
warm interpreter), which prints every thread's stack into the rank's log; and `py-spy dump` when
it is installed, which also works on a process that cannot run its handlers (stopped, or stuck in
C code with the GIL held). py-spy is looked for beside this interpreter first: a venv's bin/ is on
PATH only once the venv is activated, and `.venv/bin/ftrun` does not activate it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import psutil

from ftrun.agent.hang import Overdue
from ftrun.agent.tail import GenerationLogs

# The same as ftrun.runtime.STACKS_SIGNAL (the agent must not import it): a real-time signal,
# so that SIGUSR1/SIGUSR2 stay the script's own (preemption notices).
STACKS_SIGNAL = int(signal.SIGRTMIN) + 2
FAULTHANDLER_WAIT_S = 1.0
PY_SPY_TIMEOUT_S = 5.0
MARKER = "(most recent call first)"
REPLY_MAX_CHARS = 48 * 1024  # per rank in a reply: 8 ranks' stacks stay well under a frame


def py_spy() -> str | None:
    """py-spy's path: beside this interpreter (a venv's bin/, on PATH only once activated), else
    the one on PATH, else None."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    return shutil.which("py-spy")


def process_state(pid: int | None) -> str:
    if pid is None:
        return "unknown"
    try:
        return psutil.Process(pid).status()
    except psutil.Error:
        return "gone"


def catches(pid: int, sig: int) -> bool:
    """Whether the process has a handler installed for the signal (SigCgt in /proc)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


async def capture(
    logs: GenerationLogs, pids: dict[int, int], flush: Callable[[], None]
) -> dict[int, str]:
    """Stacks per rank, as text; a rank with none gets a line saying why. `flush` reads new
    log lines (and forwards them): the dumps arrive through the ranks' logs."""
    flush()
    marks = {rank: _line_count(logs, rank) for rank in pids}
    # Only processes that handle the signal get it: by default it kills (a cold-started script
    # that never imported ftrun has no handler), and stack-taking must not be the fault.
    handling = {r: pid for r, pid in pids.items() if catches(pid, STACKS_SIGNAL)}
    for pid in handling.values():
        try:
            os.kill(pid, STACKS_SIGNAL)
        except OSError:
            pass
    runnable = {r for r, pid in handling.items() if process_state(pid) not in ("stopped", "gone")}
    deadline = time.monotonic() + FAULTHANDLER_WAIT_S
    dumps: dict[int, str] = {}
    while runnable - dumps.keys() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        flush()
        for rank in runnable - dumps.keys():
            new = _new_lines(logs, rank, marks[rank])
            if any(MARKER in line for line in new):
                await asyncio.sleep(0.1)  # let the rest of the dump land
                flush()
                dumps[rank] = "\n".join(_new_lines(logs, rank, marks[rank]))
    spy_path = py_spy()
    if spy_path:
        for rank, pid in pids.items():
            spy = await _py_spy(spy_path, pid, stopped=process_state(pid) == "stopped")
            if spy:
                dumps[rank] = (dumps[rank] + "\n\n" if rank in dumps else "") + spy
    for rank, pid in pids.items():
        why = (
            "could not run its stack-dump handler"
            if rank in handling
            else "has no stack-dump handler (it runs without ftrun's warm start and never "
            "imported ftrun)"
        )
        dumps.setdefault(
            rank,
            f"no stacks: the process is {process_state(pid)} and {why} "
            "(install py-spy to read its stacks)",
        )
    return dumps


async def hang_report(
    overdue: list[Overdue], live: dict[int, int], logs: GenerationLogs, *, flush: Callable[[], None]
) -> dict[str, Any]:
    """The culprit among the overdue ranks, and the stacks and states of every live rank."""
    states = {r: process_state(pid) for r, pid in live.items()}
    # A stopped process is the culprit for sure; else the rank that stopped progressing first.
    culprit = next((o for o in overdue if states.get(o.rank) == "stopped"), overdue[0])
    # Every live rank's stacks: the ones waiting in a collective show where the job stands.
    dumps = await capture(logs, live, flush=flush)
    mono_to_wall = time.time() - time.monotonic()
    return {
        "rank": culprit.rank,
        "rank_step": culprit.step,
        "last_progress_t": culprit.last_progress_t + mono_to_wall,
        "allowance_s": culprit.allowance_s,
        "section": culprit.section,
        "stacks": {str(r): t for r, t in dumps.items()},
        "states": {str(r): st for r, st in states.items()},
        "overdue": [o.rank for o in overdue],
        "tail": logs.tail(culprit.rank)[-20:],
    }


def _line_count(logs: GenerationLogs, rank: int) -> int:
    log = logs.logs.get(rank)
    return log.lines_seen if log else 0


def _new_lines(logs: GenerationLogs, rank: int, mark: int) -> list[str]:
    log = logs.logs.get(rank)
    if log is None:
        return []
    fresh = log.lines_seen - mark
    return list(log.last_lines)[-fresh:] if fresh > 0 else []


async def native_dump(pid: int) -> str | None:
    """`py-spy dump --native` of one process (it pauses the process for a moment): C++ frames
    too, which is where a deadlock at exit shows. None without py-spy or on failure."""
    path = py_spy()
    return await _py_spy(path, pid, stopped=False, native=True) if path else None


async def _py_spy(path: str, pid: int, *, stopped: bool, native: bool = False) -> str | None:
    # py-spy cannot suspend a process that is already stopped; it can read it as it is.
    mode = ["--nonblocking"] if stopped else ["--native"] if native else []
    try:
        proc = await asyncio.create_subprocess_exec(
            path,
            "dump",
            *mode,
            "--pid",
            str(pid),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), PY_SPY_TIMEOUT_S)
    except (OSError, asyncio.TimeoutError):
        try:
            proc.kill()
        except (OSError, UnboundLocalError):
            pass
        return None
    text = out.decode("utf-8", "replace").strip()
    if proc.returncode != 0 or not text:
        return None
    return f"py-spy dump --pid {pid}:\n{text}"
