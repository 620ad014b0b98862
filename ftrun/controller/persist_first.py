"""A grow persists the newest step first: a host that joins may hold no snapshot in memory.

A shrink restores from the survivors' host memory (ftrun/checkpoint/restore.py), and a host's
loss from its peer's copy, but a grow often cannot: the ranks of the new host find nothing in
their host's memory (unless the peer copy pushed it a replica of the newest step), so every rank
restores from storage, which lags the newest snapshot (by up to five persists' time with the
default `persist_interval`). A grow is planned, so it need not lose
that: before the generation is torn down, the controller asks every agent for a persist now,
the same flag file a preemption notice raises but without the signal (ftrun.checkpoint persists
its next save at once; the script's own handlers are not involved), and waits for rank 0's
report that it is committed:

    grow decided ─▶ "persist" to every agent (the flag file) ─┬─ rank 0: committed ─▶ grow
                                                              ├─ PERSIST_FIRST_TIMEOUT_S ─▶ grow
                                                              └─ the generation fails: a fault

Only where the generation uses ftrun.checkpoint (rank 0 reported a checkpoint stall): a plain
script would never answer, and the grow would only wait.
"""

from __future__ import annotations

import time

from ftrun.controller.generation import Reconfigure
from ftrun.controller.server import ControlServer
from ftrun.journal import Journal
from ftrun.wire.inbound import CheckpointCommitted, Report

# Long enough for the persist in flight and the new one at the default 200 MB/s of a few GiB
# per rank; a grow that waits longer goes ahead and restores what storage has.
PERSIST_FIRST_TIMEOUT_S = 60.0


class PersistFirst:
    """One grow waiting for its persist."""

    def __init__(
        self,
        change: Reconfigure,
        *,
        server: ControlServer,
        journal: Journal,
        gen: int,
        step: int | None,
        timeout_s: float = PERSIST_FIRST_TIMEOUT_S,
    ) -> None:
        self.change, self.gen, self.journal = change, gen, journal
        self.deadline = time.monotonic() + timeout_s
        journal.record("persist_requested", gen=gen, why=change.why, step=step)
        server.broadcast("persist", gen=gen)

    def wake_at(self) -> float:
        return self.deadline

    def on_message(self, agent_id: str, msg: Report) -> Reconfigure | None:
        """Rank 0's report that the persist asked for is committed ends the wait."""
        if (
            isinstance(msg, CheckpointCommitted)
            and msg.gen == self.gen
            and msg.rank == 0
            and msg.preempt
        ):
            self.journal.record("persist_committed", gen=self.gen, step=msg.step)
            return self.change
        return None

    def expired(self, now: float) -> Reconfigure | None:
        if now < self.deadline:
            return None
        self.journal.record("persist_committed", gen=self.gen, step=None)
        return self.change
