"""An agent that is a child process of the controller, fed its bootstrap on stdin: the local
agent itself, or the `srun` that carries a Slurm node's agent. Starting it, handing it the
bootstrap, and closing its stdin (the word `fence`, then EOF: the agent fences) are the same
for both.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import IO

from ftrun import envcontract
from ftrun.bootstrap import FENCE_WORD, Bootstrap
from ftrun.errors import HostUnreachable

BOOTSTRAP_TIMEOUT_S = 10.0


async def spawn(
    argv: Sequence[str],
    boot: Bootstrap,
    *,
    log: IO[bytes],
    fail: Callable[[str], HostUnreachable],
    tagged: bool = True,
) -> asyncio.subprocess.Process:
    """`argv` in a session of its own, output into `log`, stdin a pipe, tagged with the
    agent's process tag unless `tagged` is False (a launcher that runs the agent elsewhere, and
    must not be taken for one of its processes); `fail(why)` is the error when it cannot be
    started."""
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=log,
            stderr=log,
            start_new_session=True,
            env=_environment(boot.process_tag if tagged else None),
        )
    except OSError as e:  # the program is missing or not executable
        raise fail(str(e.strerror or e)) from None


def _environment(tag: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != envcontract.AGENT_ID}
    if tag is not None:
        env[envcontract.AGENT_ID] = tag
    return env


async def send_bootstrap(
    proc: asyncio.subprocess.Process,
    boot: Bootstrap,
    *,
    terminate: Callable[[float], Awaitable[None]],
    fail: Callable[[str], HostUnreachable],
) -> None:
    """One JSON line on stdin, which stays open; a child that does not take it is terminated
    and `fail(why)` raised."""
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(dataclasses.asdict(boot)).encode() + b"\n")
    try:  # one line into an empty pipe: only a child that never reads could block it
        await asyncio.wait_for(proc.stdin.drain(), BOOTSTRAP_TIMEOUT_S)
    except (asyncio.TimeoutError, ConnectionError) as e:
        await terminate(BOOTSTRAP_TIMEOUT_S)
        raise fail(e.__class__.__name__) from None


def close_stdin(proc: asyncio.subprocess.Process) -> None:
    """`fence`, then EOF, for the agent: it fences itself (kills its ranks and exits). EOF
    alone would only make it wait for a controller to come back (agent/link.py)."""
    if proc.stdin is not None and not proc.stdin.is_closing():
        try:
            proc.stdin.write(FENCE_WORD + b"\n")
        except (ConnectionError, OSError):
            pass  # it is gone already
        proc.stdin.close()
