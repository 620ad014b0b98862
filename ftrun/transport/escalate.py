"""Making sure an agent is gone: ask, then push harder, each step given its share of the time.

Every transport ends an agent the same way: the agent was told to shut down; if it has not
ended within its share of the timeout, the next nudge (close its stdin so it fences itself,
signal its launcher, ...); once the nudges are spent, the caller's last resort (SIGKILL, a sweep
of the host). One ladder for all of them, with one rule for the bounds: each step waits
timeout / steps, so the whole stays within the timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

Nudge = Callable[[], Awaitable[None] | None]


async def escalate(
    ended: Callable[[], Awaitable[object]], nudges: Sequence[Nudge | None], timeout_s: float
) -> bool:
    """Wait for `ended()` after each nudge in turn (None: just wait, for the shutdown already
    asked); True as soon as it ends, False when every nudge has had its share in vain."""
    share = timeout_s / max(1, len(nudges))
    for nudge in nudges:
        if nudge is not None:
            result = nudge()
            if result is not None:
                try:
                    await asyncio.wait_for(result, share)
                except (asyncio.TimeoutError, OSError, EOFError):
                    pass  # a nudge that cannot be delivered: the wait below still has its share
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.ensure_future(ended())), share)
            return True
        except asyncio.TimeoutError:
            continue
    return False
