"""The agent's ring of output no controller has acknowledged (ftrun/agent/unacked.py): numbers of
the agent's own, forgotten once acked, the oldest dropped with one warning when it overflows."""

from __future__ import annotations

import logging

import pytest

from ftrun.agent.unacked import ENTRY_OVERHEAD, REPLAYED, UnackedRing


def log_of(text: str) -> dict:
    return {"gen": 1, "rank": 0, "lines": [text]}


def test_numbers_are_the_agents_own_and_acks_forget_up_to_the_number():
    ring = UnackedRing()
    sent = [ring.add("log", log_of(f"line {i}")) for i in range(5)]
    assert [f["oseq"] for f in sent] == [1, 2, 3, 4, 5]
    assert sent[0] == {"gen": 1, "rank": 0, "lines": ["line 0"], "oseq": 1}
    ring.ack(3)
    assert [e.number for e in ring.pending()] == [4, 5]
    assert [e.fields["lines"] for e in ring.pending()] == [["line 3"], ["line 4"]]
    ring.ack(2)  # an older ack (a late heartbeat) changes nothing
    assert len(ring) == 2 and ring.acked == 3
    ring.ack(5)
    assert len(ring) == 0 and ring.bytes == 0
    assert ring.add("log", log_of("next"))["oseq"] == 6  # numbering goes on


def test_the_ring_keeps_what_it_sends_again_exactly():
    ring = UnackedRing()
    fields = ring.add("rank_exited", {"gen": 2, "rank": 1, "exit_code": 1, "tail": ["boom"]})
    (entry,) = ring.pending()
    assert entry.kind == "rank_exited" and entry.fields == fields and entry.number == 1


@pytest.mark.parametrize(
    "bound, kept",
    [
        ({"max_messages": 4}, [7, 8, 9, 10]),
        # each message weighs its text and the overhead: three fit in 3 * (overhead + 6)
        ({"max_bytes": 3 * (ENTRY_OVERHEAD + 6)}, [8, 9, 10]),
    ],
)
def test_overflow_drops_the_oldest_with_one_warning(caplog, bound, kept):
    ring = UnackedRing(**bound)
    with caplog.at_level(logging.WARNING, logger="ftrun.agent"):
        for i in range(10):
            ring.add("log", log_of(f"line {i}"))
    assert [e.number for e in ring.pending()] == kept
    assert ring.dropped == ring.untold == 10 - len(kept)
    warnings = [r for r in caplog.records if "dropping the oldest" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    # acknowledged again, a later overflow is a new one: warned anew
    ring.ack(10)
    with caplog.at_level(logging.WARNING, logger="ftrun.agent"):
        for i in range(10):
            ring.add("log", log_of(f"again {i}"))
    assert len([r for r in caplog.records if "dropping the oldest" in r.getMessage()]) == 2


def test_one_message_bigger_than_the_bound_is_kept_alone():
    ring = UnackedRing(max_bytes=10)
    ring.add("log", log_of("x" * 100))
    assert len(ring) == 1
    ring.add("log", log_of("y" * 100))
    assert [e.number for e in ring.pending()] == [2] and ring.dropped == 1


def test_what_is_replayed():
    assert {"log", "rank_exited", "rank_hung", "gen_exited"} == REPLAYED
    assert not {"progress", "pace", "idle", "heartbeat", "stopped"} & REPLAYED
