"""The current generation's ranks as `ftrun status JOB` lists them, from journals with known
contents; and the controller journaling every rank's exit, clean ones too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ftrun.controller.generation import GenWatch
from ftrun.jobview import fold
from ftrun.jobview.ranks import fold_ranks
from ftrun.wire.inbound import RankExited
from tests.unit.test_goodput import ev, started


def two_hosts(gen: int, t: float) -> list[dict[str, Any]]:
    """Generation `gen` on a and b, 2 ranks each, every rank started (pid 100·gen + rank)."""
    return [
        ev("generation_launched", t, gen=gen, hosts=["a", "b"], world_size=4),
        *(
            ev("rank_started", t + 1, gen=gen, host="ab"[r // 2], rank=r, pid=100 * gen + r)
            for r in range(4)
        ),
    ]


def states(events: list[dict[str, Any]], *, running: bool) -> list[tuple]:
    return [
        (r.rank, r.host, r.local_rank, r.pid, r.state_text)
        for r in fold_ranks(events, job_running=running)
    ]


def test_running_ranks_and_how_each_ended() -> None:
    events = [started(0.0), *two_hosts(1, 1.0)]
    assert states(events, running=True) == [
        (0, "a", 0, 100, "running"),
        (1, "a", 1, 101, "running"),
        (2, "b", 0, 102, "running"),
        (3, "b", 1, 103, "running"),
    ]
    events += [
        ev("rank_exited", 5.0, gen=1, host="b", rank=3, pid=103, exit_code=None, signal="SIGKILL"),
        ev("rank_exited", 5.0, gen=1, host="a", rank=1, pid=101, exit_code=0, signal=None),
        ev("rank_exited", 5.1, gen=1, host="b", rank=2, pid=102, exit_code=3, signal=None),
    ]
    assert [s[4] for s in states(events, running=True)] == [
        "running", "exited 0", "exited 3", "killed SIGKILL",
    ]  # fmt: skip
    events.append(ev("generation_ended", 6.0, gen=1, outcome="failed"))
    assert states(events, running=True)[0][4] == "killed (torn down, generation failed)"


def test_only_the_current_generation_is_listed() -> None:
    events = [
        started(0.0),
        *two_hosts(1, 1.0),
        ev("generation_ended", 5.0, gen=1, outcome="failed"),
    ]
    events += two_hosts(2, 7.0)[:2]  # gen 2 launched; rank 0 started, the others not yet
    assert states(events, running=True) == [(0, "a", 0, 200, "running")]


def test_a_generation_that_succeeded_exited_0_and_a_dead_controller_leaves_it_unknown() -> None:
    events = [started(0.0), *two_hosts(1, 1.0)]
    done = [*events, ev("generation_ended", 9.0, gen=1, outcome="succeeded")]
    # a journal from before clean exits were journaled: success says each exited 0
    assert {s[4] for s in states(done, running=False)} == {"exited 0"}
    dead = states(events, running=False)  # no generation_ended, no job_finished
    assert {s[4] for s in dead} == {"unknown (the job ended without ending its generation)"}


def test_the_job_view_carries_the_ranks_into_json() -> None:
    view = fold(Path("/nonexistent/j"), [started(0.0), *two_hosts(1, 1.0)])  # dead controller
    [first, *_] = view.to_json(detail=True)["ranks"]
    assert first == {
        "rank": 0, "host": "a", "local_rank": 0, "pid": 100, "state": "unknown",
        "exit_code": None, "signal": None,
        "why": "the job ended without ending its generation",
    }  # fmt: skip
    assert "ranks" not in view.to_json()


class Journal:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def record(self, kind: str, **fields: Any) -> None:
        self.events.append((kind, fields))

    def append_log(self, *args: Any) -> None: ...
    def rank_output(self, *args: Any) -> None: ...


@pytest.mark.parametrize(
    ("exit_code", "signal", "evidence"),
    [(0, None, False), (1, None, True), (None, "SIGKILL", True)],
)
def test_the_controller_journals_every_rank_exit(exit_code, signal, evidence) -> None:
    journal = Journal()
    watch = GenWatch(
        7, {"a"}, {"a": "h"}, order=["a"], stall=None, journal=journal, reporter=journal,  # type: ignore[arg-type]
        nproc_per_node=2,
    )  # fmt: skip
    msg = RankExited(
        gen=7, rank=1, pid=4242, exit_code=exit_code, signal=signal, traceback="Traceback ...",
        exception="E",
    )  # fmt: skip
    news = watch.on_message("a", msg)
    [(kind, fields)] = journal.events
    assert kind == "rank_exited" and fields["pid"] == 4242 and fields["host"] == "h"
    assert (fields["exit_code"], fields["signal"]) == (exit_code, signal)
    assert ("traceback" in fields) == evidence  # a clean exit's tail is no evidence
    assert (news is not None) == evidence  # a failure; a clean exit is the stall desk's
    assert watch.clean_ranks == (set() if evidence else {1})
