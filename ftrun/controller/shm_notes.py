"""What the user is told about the checkpoint memory tier's room on each host (pure: text only).

Agents send /dev/shm's size and free space with their hello; a rank whose tier stepped down
(ftrun/checkpoint/capacity.py: live -> copies -> storage only, for want of room) reports it with
the figures. Both are notes, never refusals: a job whose tier does not fit checkpoints to storage.
"""

from __future__ import annotations

from typing import Any

from ftrun.wire.inbound import CheckpointTier, Hello

# Below this much free /dev/shm a host is named at launch: the tier takes 3 x each rank's state
# (three slots; the live snapshot adds one more), and 1 GiB holds the tier of one rank with ~340
# MiB of state.
SMALL_SHM_BYTES = 1 << 30


def mib(n: Any) -> str:
    return f"{n / 2**20:,.0f} MiB" if isinstance(n, int) and n >= 0 else "?"


def hello_note(host: str, msg: Hello) -> str | None:
    """A note when the host's /dev/shm is small for a memory tier; None otherwise."""
    free, total = msg.shm_free, msg.shm_total
    if not isinstance(free, int) or free >= SMALL_SHM_BYTES:
        return None
    return (
        f"{host}: /dev/shm has {mib(free)} free of {mib(total)}; the checkpoint memory tier "
        "takes 3 x each rank's state (4 x with the live snapshot, 2 x with memory_slots=2): a "
        "rank whose tier does not fit checkpoints to storage only (see the ranks' warnings)"
    )


def tier_note(host: str, msg: CheckpointTier) -> str:
    """A rank's tier stepped down: where, to what, with the figures."""
    need, free, total = msg.need, msg.free, msg.total
    figures = (
        f" (needs up to {mib(need)}; /dev/shm has {mib(free)} free of {mib(total)})"
        if isinstance(need, int) and need > 0
        else ""
    )
    return (
        f"{host} rank {msg.rank}: the checkpoint memory tier steps down from "
        f"{msg.from_} to {msg.tier}{figures}: {str(msg.why)[:300]}"
    )
