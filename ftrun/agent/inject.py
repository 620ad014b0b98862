"""Fault injection on the agent's side (`ftrun chaos`): when a request is due, and what it does.

kill-rank SIGKILLs the rank, hang-rank SIGSTOPs it (the process stays, doing nothing);
kill-agent SIGKILLs this agent (its processes follow: the zygote on stdin EOF, forks by
PDEATHSIG), freeze-agent SIGSTOPs it (the controller must notice the silence and clean up).
"""

from __future__ import annotations

import os
import signal
from typing import Any

ACTION_SIGNALS = {
    "kill-rank": signal.SIGKILL,
    "hang-rank": signal.SIGSTOP,
    "kill-agent": signal.SIGKILL,
    "freeze-agent": signal.SIGSTOP,
}


def take_due(
    pending: list[dict[str, Any]], steps: dict[int, int], rank_pids: dict[int, int]
) -> list[dict[str, Any]]:
    """Remove and return the requests whose step has come and whose target rank has started.
    The step is the named rank's, or this host's (its ranks' highest) when no rank is named or
    the named one reports none: a script may report steps from rank 0 alone (a progress regex
    on a line only rank 0 prints), and "kill rank 1 at step 600" means the job's step 600."""
    due = []
    host_step = max(steps.values(), default=None)
    for inj in list(pending):
        at, rank = inj.get("at_step"), inj.get("rank")
        if at is not None:
            step = steps.get(rank, host_step) if rank is not None else host_step
            if step is None or step < at:
                continue
        if rank is not None and rank not in rank_pids:
            continue
        pending.remove(inj)
        due.append(inj)
    return due


def perform(action: str, rank_pid: int | None) -> None:
    target = os.getpid() if action in ("kill-agent", "freeze-agent") else rank_pid
    if target is None:
        return
    try:
        os.kill(target, ACTION_SIGNALS[action])
    except OSError:
        pass  # the rank is already gone
