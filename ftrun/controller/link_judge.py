"""The link check's rounds and its verdict, pure: which hosts pair up in each round, and from the
pairs' figures, which host or link is bad (link_check.py runs it; agent/linkprobe.py measures).

DLRover's network check (dlrover/python/master/elastic_training/rdzv_manager.py,
NetworkCheckRendezvousManager; and unified/backend/elastic/node_check_manager.py) runs two
rounds of collectives in small groups: round 0 pairs nodes in order, (0,1), (2,3)...; round 1
pairs them again so that each meets another peer; a node that fails in both rounds is the faulty
one, and a node slower than 2x the median time is a straggler. Here the rounds are fixed in
advance, so one order to every agent runs them all: the hosts in a ring, round 1 pairs (0,1),
(2,3)..., round 2 the shifted pairs (1,2), (3,0)...; with an odd count, a third round holds the
one pair left, (n-1,0). Every host is then in exactly two pairs, with two different peers, and
the first host of a pair, which holds the pair's store, holds one in the whole check.

The verdict: a host slow in both its pairs is the bad one (left out); a pair slow while both its
hosts are fine with their other peer is a bad link (said: which end is at fault the figures
cannot tell, and either may be the one the job needs). Two hosts make one pair: no majority
says which end is slow, so nothing is judged. More than half the hosts slow is not the hosts'
fault (a loaded machine, the check itself): nobody is left out.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field

# "Slow" is far off the typical pair: latency 3x (and LATENCY_FLOOR_S more), bandwidth 1/5.
# What is worth leaving a host out for is an order of magnitude off (a NIC at 100 Mbit/s where
# the others run at Gbit/s; a congested or lossy path), and DLRover's straggler rule is 2x.
# Bandwidth gets more room than latency because it is the noisier figure where the CPU moves the
# bytes: between the testbed's namespaces on a loaded 2-core machine, a healthy pair's best of a
# few 2 MiB all-reduces was seen 4.4x below the typical pair's, while small all-reduces' median
# stayed within 2x.
SLOW_FACTOR = 3.0
BANDWIDTH_FACTOR = 5.0
# Latency must also be this much above the typical pair's: at a tenth of a millisecond, a few
# context switches on a loaded host triple a small all-reduce without the link being at fault.
LATENCY_FLOOR_S = 0.001

Pair = tuple[str, str]  # (the host holding the pair's store, its peer)


def schedule(hosts: list[str]) -> list[list[Pair]]:
    """The rounds of pairs for `hosts`, in their order (a ring): see the module's docstring."""
    n = len(hosts)
    if n < 2:
        return []
    if n == 2:
        return [[(hosts[0], hosts[1])]]
    rounds = [
        [(hosts[i], hosts[i + 1]) for i in range(0, n - 1, 2)],
        [(hosts[i], hosts[(i + 1) % n]) for i in range(1, n - 1 if n % 2 else n, 2)],
    ]
    if n % 2:
        rounds.append([(hosts[-1], hosts[0])])
    return rounds


@dataclass(frozen=True, kw_only=True)
class PairResult:
    """One pair's figures (agent/linkprobe.py's), or why it has none."""

    round: int
    hosts: Pair
    latency_s: float | None = None
    bandwidth_Bps: float | None = None
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class LinkVerdict:
    typical_latency_s: float | None = None
    typical_bandwidth_Bps: float | None = None
    slow: dict[Pair, str] = field(default_factory=dict)  # pair → why it is slow
    bad_hosts: dict[str, str] = field(default_factory=dict)  # host → why, one line
    bad_links: dict[Pair, str] = field(default_factory=dict)
    note: str | None = None  # why nobody was judged, when that is so


def _ms(s: float) -> str:
    return f"{s * 1e3:.3g} ms"


def _mbps(bps: float) -> str:
    return f"{bps / 1e6:.3g} MB/s"


def _typical(values: list[float]) -> float | None:
    """The typical healthy pair's figure, `values` best first. One bad host makes two slow
    pairs, so the two worst are left out before the median (down to the best one): with 3 or
    4 hosts half the pairs or more can be the bad host's, and a plain median would be theirs."""
    if not values:
        return None
    return statistics.median(values[: max(1, len(values) - 2)])


def why_slow(r: PairResult, latency: float | None, bandwidth: float | None) -> str | None:
    if r.error is not None:
        return f"failed ({r.error})"
    if r.latency_s is None or r.bandwidth_Bps is None:
        return "no figures"
    if (
        latency is not None
        and r.latency_s >= SLOW_FACTOR * latency
        and r.latency_s - latency >= LATENCY_FLOOR_S
    ):
        return f"latency {_ms(r.latency_s)}, typical {_ms(latency)}"
    if bandwidth is not None and r.bandwidth_Bps * BANDWIDTH_FACTOR <= bandwidth:
        return f"bandwidth {_mbps(r.bandwidth_Bps)}, typical {_mbps(bandwidth)}"
    return None


def judge(hosts: list[str], results: list[PairResult]) -> LinkVerdict:
    """The verdict on `hosts` from their pairs' `results` (one per pair of schedule(hosts))."""
    measured = [r for r in results if r.error is None and r.latency_s and r.bandwidth_Bps]
    latency = _typical(sorted(r.latency_s or 0.0 for r in measured))
    bandwidth = _typical(sorted((r.bandwidth_Bps or 0.0 for r in measured), reverse=True))
    typical = LinkVerdict(typical_latency_s=latency, typical_bandwidth_Bps=bandwidth)
    if len(hosts) < 3:
        return dataclasses.replace(
            typical,
            note=f"{len(hosts)} host(s) make at most one pair: no majority says which end of a "
            "slow link is at fault, so nobody is judged",
        )
    slow = {r.hosts: why for r in results if (why := why_slow(r, latency, bandwidth)) is not None}
    bad: dict[str, str] = {}
    for host in hosts:
        mine = [r.hosts for r in results if host in r.hosts]
        if len(mine) >= 2 and all(p in slow for p in mine):
            peers = "; ".join(f"with {p[1] if p[0] == host else p[0]}: {slow[p]}" for p in mine)
            bad[host] = f"{host} is slow with each of its peers ({peers})"
    if len(bad) * 2 >= len(hosts):
        return dataclasses.replace(
            typical,
            slow=slow,
            note=f"{len(bad)} of {len(hosts)} hosts look slow: more than a bad host or link "
            "explains (a loaded machine?), so nobody is left out",
        )
    links = {p: why for p, why in slow.items() if p[0] not in bad and p[1] not in bad}
    return dataclasses.replace(typical, slow=slow, bad_hosts=bad, bad_links=links)
