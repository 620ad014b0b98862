"""What a generation's watch waits on beside the agents' messages: one protocol, one list.

`Supervisor._watch` awaits the next message until the earliest `wake_at()` of its waiters;
each turn it asks every waiter whether its time has ended the watch (`expired`), and gives
every message of the generation to each (`on_message`). A waiter with nothing to say returns
None. The first result ends the watch, in the list's order (a preemption's grace before a grow's
persist: both running out at once is the preemption).

The waiters: the exit barrier and the idle guard (`StallWaiter`), the notes while the first step
is slow to come (`FirstStepPatience`), the straggler watch (pace.StragglerWatch), a preemption
notice's grace (preemption.PreemptWait) and a grow waiting for its persist
(persist_first.PersistFirst). A new concern of the watch (a standby controller's lease) is one
more class with these three methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ftrun.controller.patience import Patience
from ftrun.controller.reporting import Reporter
from ftrun.controller.stalldesk import StallDesk
from ftrun.wire.inbound import Report

if TYPE_CHECKING:
    from ftrun.controller.generation import GenWatch, WatchResult


class Waiter(Protocol):
    def wake_at(self) -> float | None:
        """The monotonic time this waiter next needs a turn at; None: only messages matter."""

    def expired(self, now: float) -> WatchResult | None:
        """What ends the watch now that the clock reads `now` (monotonic), if anything."""

    def on_message(self, agent_id: str, msg: Report) -> WatchResult | None:
        """What this message of the generation (not forged, not stale) means to the watch."""


def earliest(waiters: list[Waiter]) -> float | None:
    """The soonest wake-up any waiter asks for (None: none asks)."""
    return min((t for w in waiters if (t := w.wake_at()) is not None), default=None)


class StallWaiter:
    """The exit barrier and the idle guard of one generation (stalldesk.py): asking for stacks
    when due, and the stall they then show."""

    def __init__(self, desk: StallDesk, watch: GenWatch) -> None:
        self.desk, self.watch = desk, watch

    def wake_at(self) -> float | None:
        return self.watch.stall.wakeup()

    def expired(self, now: float) -> WatchResult | None:
        return self.desk.poll(self.watch)

    def on_message(self, agent_id: str, msg: Report) -> WatchResult | None:
        return None  # its messages come through GenWatch.on_message and StallDesk.news


class FirstStepPatience:
    """Notes, at doubling intervals, on what a generation's first step is waiting for."""

    def __init__(self, reporter: Reporter, watch: GenWatch, *, first_s: float) -> None:
        self.watch = watch
        self.patience = Patience(reporter, first_s=first_s)

    def wake_at(self) -> float | None:
        return None if self.watch.first_step_seen else self.patience.due()

    def expired(self, now: float) -> WatchResult | None:
        if not self.watch.first_step_seen:
            self.patience.note(self.watch.no_step_yet)
        return None  # a slow start is said, never judged here (the hang policy judges it)

    def on_message(self, agent_id: str, msg: Report) -> WatchResult | None:
        return None
