"""GenWatch.forged: an agent speaks for its own host's ranks only (issue 11: a holder of the
job's keys must not report another host's rank as crashed)."""

from __future__ import annotations

import pytest

from ftrun.controller.generation import GenWatch
from ftrun.wire.inbound import Log, PeerFetched, RankExited, RankHung, RanksIdle, Signalled, Stacks

AGENTS = ["n1#0", "n2#0", "n3#0"]


def watch() -> GenWatch:
    return GenWatch(
        4,
        set(AGENTS),
        {a: a.split("#")[0] for a in AGENTS},
        order=list(AGENTS),
        stall=None,  # type: ignore[arg-type]  # forged() never looks at it
        journal=None,  # type: ignore[arg-type]
        reporter=None,  # type: ignore[arg-type]
        nproc_per_node=2,
    )


@pytest.mark.parametrize(
    "agent, msg",
    [
        ("n2#0", RankExited(gen=4, rank=2)),
        ("n2#0", RankExited(gen=4, rank=3)),
        ("n1#0", Log(gen=4, rank=None, lines=[])),  # torchrun's own output
        ("n3#0", RanksIdle(gen=4, ranks={"4": 1.0, "5": 2.0})),
        ("n3#0", Signalled(gen=4, ranks=[4, 5])),
        ("n1#0", RankHung(gen=4, rank=1, overdue=[0, 1], stacks={"0": "s"})),
        # a host that joined a re-planned job fetched old ranks' snapshots: it speaks for none
        ("n3#0", PeerFetched(gen=4, ranks=[0, 1], snapshots=[[0, 9, 2]])),
    ],
)
def test_an_agent_may_speak_for_its_own_ranks(agent, msg):
    assert watch().forged(agent, msg) is None


@pytest.mark.parametrize(
    "agent, msg, why",
    [
        ("n1#0", RankExited(gen=4, rank=2), "spoke for rank(s) 2"),
        ("n2#0", Log(gen=4, rank=0, lines=[]), "runs ranks 2..3"),
        ("n3#0", RanksIdle(gen=4, ranks={"0": 1.0}), "rank(s) 0"),
        ("n1#0", RankHung(gen=4, rank=0, overdue=[0, 5]), "rank(s) 5"),
        ("n1#0", Stacks(gen=4, tails={"4": []}), "rank(s) 4"),
        ("spare#0", RankExited(gen=4, rank=0), "no part in generation 4"),
    ],
)
def test_an_agent_speaking_for_another_hosts_ranks_is_refused(agent, msg, why):
    reason = watch().forged(agent, msg)
    assert reason is not None and why in reason
