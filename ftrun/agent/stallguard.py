"""Judging others by their silence, when our own loop may be the one that stalled.

Two of the agent's timed checks judge others by how long they have been silent: the fence
(link.py: no word from the controller) and the hang detector (watch.py: no step from a rank).
When our own loop wakes up late, we were the ones stalled (a loaded host, a long GC pause): what
the others sent meanwhile is still unread, and judging now would blame them for our pause. So a
check that wakes up late waits one tick while that is read (docs/timeouts.md).
"""

from __future__ import annotations

import asyncio
import time

# A timed loop that wakes this much later than it asked was stalled itself: it defers one check.
STALLED_TICK_S = 0.1


class StallGuard:
    """For a loop that judges others by their silence: due() is False right after the loop woke
    up late (we were stalled; what others sent meanwhile is still unread), never twice in a row,
    so a loop that is always late still judges."""

    def __init__(self) -> None:
        self._wake = time.monotonic()
        self._deferred = False

    def due(self) -> bool:
        late = time.monotonic() - self._wake
        self._deferred = late > STALLED_TICK_S and not self._deferred
        return not self._deferred

    async def sleep(self, seconds: float) -> None:
        self._wake = time.monotonic() + seconds
        await asyncio.sleep(seconds)
