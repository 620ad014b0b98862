"""The watch's waiters (ftrun/controller/waiters.py): one protocol, the earliest wake-up, and
what ends a watch under a preemption notice. Pure: a real journal, a recording server."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ftrun.controller.generation import Reconfigure
from ftrun.controller.persist_first import PersistFirst
from ftrun.controller.preemption import Preempted, under
from ftrun.controller.reporting import OutcomeState
from ftrun.controller.waiters import Waiter, earliest
from ftrun.journal import Journal
from ftrun.journal.read import read_events
from ftrun.wire.inbound import CheckpointCommitted, Report


class Broadcasts:
    """The server seam: what would have been sent to every agent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def broadcast(self, kind: str, **fields: Any) -> None:
        self.sent.append((kind, fields))


class At:
    def __init__(self, t: float | None) -> None:
        self.t = t

    def wake_at(self) -> float | None:
        return self.t

    def expired(self, now: float) -> None:
        return None

    def on_message(self, agent_id: str, msg: Report) -> None:
        return None


def test_the_earliest_wake_up_of_those_that_ask():
    waiters: list[Waiter] = [At(None), At(7.0), At(3.5), At(None)]
    assert earliest(waiters) == 3.5
    assert earliest([At(None)]) is None and earliest([]) is None


def test_a_grow_waits_for_its_persist_then_goes_ahead_on_the_commit_or_the_deadline(
    tmp_path: Path,
):
    journal, server = Journal(tmp_path / "job"), Broadcasts()
    change = Reconfigure("grow", "onto 2 ready hosts")
    grow = PersistFirst(change, server=server, journal=journal, gen=2, step=40, timeout_s=60)  # type: ignore[arg-type]
    assert server.sent == [("persist", {"gen": 2})]
    deadline = grow.wake_at()
    assert grow.expired(deadline - 0.001) is None
    ordinary = CheckpointCommitted(gen=2, rank=0, step=40)
    assert grow.on_message("agent-1", ordinary) is None  # not the persist it asked for
    persisted = dataclasses.replace(ordinary, step=41, preempt=True)
    older = dataclasses.replace(persisted, gen=1)
    assert grow.on_message("agent-1", older) is None  # an older generation's
    assert grow.on_message("agent-1", persisted) is change
    late = PersistFirst(change, server=server, journal=journal, gen=3, step=50, timeout_s=0)  # type: ignore[arg-type]
    assert late.expired(late.wake_at()) is change
    kinds = [(e["kind"], e.get("step")) for e in read_events(tmp_path / "job")]
    assert kinds == [
        ("persist_requested", 40),
        ("persist_committed", 41),
        ("persist_requested", 50),
        ("persist_committed", None),
    ]


def test_under_a_notice_every_ending_is_the_preemption_but_a_stop():
    class Notice:
        def result(self, why: str) -> Preempted:
            return Preempted(1.0, "SIGUSR1", 10, None, why)

    notice: Any = Notice()
    own = Preempted(1.0, "SIGUSR1", 10, 12, "checkpoint of step 12 committed")
    assert under(notice, own) is own  # its own ending passes as it is
    assert under(notice, OutcomeState.STOPPED) is OutcomeState.STOPPED
    assert under(notice, OutcomeState.SUCCEEDED).why == "every rank exited 0 after the notice"
    assert under(None, OutcomeState.SUCCEEDED) is OutcomeState.SUCCEEDED
