"""Let torch's gloo workers finish before a process group can be destroyed (warm ranks only).

torch 2.13's gloo deadlock at exit (docs/architecture.md, "A torch race"): every gloo collective
issued in a backward pass holds, in its captured thread-local state, a reference to a Python
object; the worker thread that ran it drops that reference when it is done, and for that it needs
the GIL. If the worker was preempted until the main thread, holding the GIL, frees the process
group (a DDP script after `destroy_process_group()`, when it drops the model), the destructor
joins the worker and the worker waits for the GIL: both wait for ever. A busy machine makes the
preemption likely (9 of 30 warm runs of ddp_destroy.py with the suite beside them).

What this does about it, without changing torch: `destroy_process_group()` waits, with the GIL
released, until every gloo worker thread of the process is parked waiting for work, before it
destroys and again after. A parked worker holds no collective, so a destructor that joins it
later cannot deadlock. The wait reads each worker's blocking system call from
/proc/self/task/TID/syscall: a parked worker waits on a condition variable with no deadline
(futex FUTEX_WAIT_BITSET, no timeout), beside the group's other workers on the same address; one
waiting for the GIL waits with a deadline (CPython's take_gil), and one still working is not in
futex at all. The wait is bounded (`LIMIT_S`); past it destroy goes on as torch's would, and
the agent's exit-race net (verdict.gloo_exit_race) remains. Linux on x86-64 and arm64 only (the futex number); elsewhere it does nothing.
"""

from __future__ import annotations

import functools
import os
import platform
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

WORKER_NAME = "pt_gloo_runloop"  # ProcessGroupGloo's worker threads (c10::setThreadName)
FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
FUTEX_CMD_MASK = 0x7F  # without FUTEX_PRIVATE_FLAG and FUTEX_CLOCK_REALTIME
FUTEX_WAIT_BITSET = 9  # what pthread_cond_wait blocks in
COND_WORDS_MASK = 7
LIMIT_S = 2.0
POLL_S = 0.001  # time.sleep releases the GIL: the worker waiting for it gets it


def parked_on(syscall_line: str) -> int | None:
    """The condition variable a thread waits on (its address, to 8 bytes), from its /proc
    syscall line, if the wait is a condition wait without a deadline; None otherwise."""
    fields = syscall_line.split()
    if FUTEX is None or len(fields) < 5 or fields[0] != str(FUTEX):
        return None
    try:
        address, op, timeout = int(fields[1], 16), int(fields[2], 16), int(fields[4], 16)
    except ValueError:
        return None
    if op & FUTEX_CMD_MASK != FUTEX_WAIT_BITSET or timeout != 0:
        return None
    # glibc's condition variable has two futex words side by side (__g_signals[2], its two
    # groups of waiters): workers of one condition wait on either, 4 bytes apart.
    return address & ~COND_WORDS_MASK


def busy_workers(task_dir: str = "/proc/self/task") -> list[str]:
    """The gloo worker threads of this process that are not parked. A group's workers park on
    one condition variable, so a worker counts as parked only beside another on the same
    address: a lone condition wait is CPython's drop_gil waiting for the GIL's next holder
    (switch_cond), which a worker passes through right after it dropped a reference."""
    waits: dict[str, int | None] = {}
    for tid in os.listdir(task_dir):
        try:
            with open(f"{task_dir}/{tid}/comm") as f:
                if f.read().strip() != WORKER_NAME:
                    continue
            with open(f"{task_dir}/{tid}/syscall") as f:
                waits[tid] = parked_on(f.read())
        except OSError:  # the thread ended
            continue
    shared = Counter(address for address in waits.values() if address is not None)
    return [tid for tid, address in waits.items() if address is None or shared[address] < 2]


def wait_parked(limit: float = LIMIT_S) -> bool:
    """Until every gloo worker is parked, or `limit` seconds: whether they all were."""
    deadline = time.monotonic() + limit
    while busy_workers():
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def guarded(destroy: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(destroy)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        wait_parked()  # a group freed inside destroy (the model dropped before it)
        try:
            return destroy(*args, **kwargs)
        finally:
            wait_parked()  # a group freed later, with the model

    destroy_process_group.__ftrun_guarded__ = True  # type: ignore[attr-defined]
    return destroy_process_group


def install() -> None:
    """Guard torch.distributed.destroy_process_group in this process, where torch.distributed is
    loaded (a warm rank: the zygote preloaded it) and the platform is known."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    dist = sys.modules.get("torch.distributed")
    if FUTEX is None or c10d is None or dist is None:
        return
    name = "destroy_process_group"  # set by name: the modules are typed, ours is a wrapper
    original = getattr(c10d, name)
    if getattr(original, "__ftrun_guarded__", False):
        return
    wrapped = guarded(original)
    setattr(c10d, name, wrapped)
    if getattr(dist, name, None) is original:
        setattr(dist, name, wrapped)
