"""Simulated time: actions queued for when they happen, run in that order.

The simulated job (engine.py) never sleeps: each phase queues what comes next `at` a time, and
the clock jumps there. Actions queued for one time run in the order they were queued.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable


class EventClock:
    def __init__(self, start_s: float) -> None:
        self.t = start_s  # seconds since the trace's start
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self.t

    def at(self, t: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (t, next(self._seq), action))

    def run(self, *, until: Callable[[], bool]) -> None:
        """The queued actions in time order, until none is left or `until()` holds."""
        while self._queue and not until():
            t, _, action = heapq.heappop(self._queue)
            self.t = max(self.t, t)
            action()
