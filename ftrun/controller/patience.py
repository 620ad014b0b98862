"""Saying, now and then, what a long wait is waiting for.

Connecting to hosts and a generation's way to its first step (rendezvous, imports, a restore)
usually take seconds; when they take longer, the person at the terminal should see what is
awaited rather than silence. A note after `first_s`, then at doubling intervals, so a wait of
minutes prints a handful of lines, not one a second (and a log stays readable).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ftrun.controller.reporting import Reporter


class Patience:
    def __init__(
        self,
        reporter: Reporter,
        *,
        first_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reporter = reporter
        self.clock = clock
        self.began = clock()
        self.next_s = first_s

    def due(self) -> float:
        """When the next note is due (the clock's time): a wakeup for the caller's wait."""
        return self.began + self.next_s

    def note(self, say: Callable[[float], str | None]) -> None:
        """If a note is due, give `say(seconds waited so far)` to the reporter (None: nothing
        to add)."""
        waited = self.clock() - self.began
        if waited >= self.next_s:
            text = say(waited)
            if text is not None:
                self.reporter.notice(text)
            self.next_s = max(self.next_s * 2, waited + 1.0)
