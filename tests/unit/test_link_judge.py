"""link_judge.py: the link check's rounds, and its verdict from the pairs' figures: a bad host
(slow with each of its peers), a bad link (one pair slow), nothing, and when it cannot judge."""

from __future__ import annotations

from collections import Counter

import pytest

from ftrun.controller.link_judge import PairResult, judge, schedule

HEALTHY = (0.0002, 500e6)  # latency s, bandwidth B/s
NIC_100MBIT = (0.0003, 11e6)
DELAYED = (0.05, 30e6)


def hosts(n: int) -> list[str]:
    return [f"node{i}" for i in range(1, n + 1)]


def results(names: list[str], figures=lambda pair: HEALTHY) -> list[PairResult]:
    """Every pair of the schedule with `figures(pair)`: (latency, bandwidth), or a str error."""
    out = []
    for number, pairs in enumerate(schedule(names), 1):
        for pair in pairs:
            f = figures(pair)
            if isinstance(f, str):
                out.append(PairResult(round=number, hosts=pair, error=f))
            else:
                out.append(PairResult(round=number, hosts=pair, latency_s=f[0], bandwidth_Bps=f[1]))
    return out


def with_host(bad: str, f, others=HEALTHY):
    return lambda pair: f if bad in pair else others


@pytest.mark.parametrize("n", [3, 4, 5, 6, 7, 8])
def test_each_host_meets_two_peers_and_holds_one_store_at_most(n):
    names = hosts(n)
    rounds = schedule(names)
    assert len(rounds) == (2 if n % 2 == 0 else 3)
    for pairs in rounds:
        in_round = [h for p in pairs for h in p]
        assert len(in_round) == len(set(in_round))  # nobody twice in a round
    pairs = [p for r in rounds for p in r]
    for h in names:
        peers = {p[1] if p[0] == h else p[0] for p in pairs if h in p}
        assert len(peers) == 2, h
    assert max(Counter(p[0] for p in pairs).values()) == 1


def test_the_rounds_are_dlrovers_pairs_then_the_shifted_ones():
    assert schedule(hosts(4)) == [
        [("node1", "node2"), ("node3", "node4")],
        [("node2", "node3"), ("node4", "node1")],
    ]
    assert schedule(hosts(2)) == [[("node1", "node2")]]
    assert schedule(hosts(1)) == []


@pytest.mark.parametrize("n", [3, 4, 5, 8])
def test_healthy_hosts_with_a_busy_machines_noise_are_all_fine(n):
    names = hosts(n)

    # within 2x of each other, as a loaded 2-core machine makes them
    def noisy(pair):
        k = int(pair[0][4:])  # deterministic: 1x, 2x, 3x latency; 1x, 1/2 bandwidth
        return (0.0002 * (1 + k % 3), 500e6 / (1 + k % 2))

    v = judge(names, results(names, noisy))
    assert v.bad_hosts == {} and v.bad_links == {} and v.slow == {} and v.note is None


@pytest.mark.parametrize("n", [3, 4, 5, 6])
@pytest.mark.parametrize("figures", [NIC_100MBIT, DELAYED, "timed out"])
def test_a_host_slow_with_each_of_its_peers_is_the_bad_one(n, figures):
    names = hosts(n)
    v = judge(names, results(names, with_host("node3", figures)))
    assert list(v.bad_hosts) == ["node3"]
    assert v.bad_links == {}
    why = v.bad_hosts["node3"]
    assert why.startswith("node3 is slow with each of its peers")
    assert ("bandwidth" in why) if figures is NIC_100MBIT else True
    assert ("latency 50 ms" in why) if figures is DELAYED else True
    assert ("failed (timed out)" in why) if isinstance(figures, str) else True


@pytest.mark.parametrize("n", [3, 4, 5])
def test_one_slow_pair_is_a_bad_link_and_nobody_is_bad(n):
    names = hosts(n)
    link = schedule(names)[0][0]
    v = judge(names, results(names, lambda pair: NIC_100MBIT if pair == link else HEALTHY))
    assert v.bad_hosts == {}
    assert list(v.bad_links) == [link] and "bandwidth 11 MB/s" in v.bad_links[link]


def test_a_few_tenths_of_a_millisecond_is_scheduling_not_a_slow_link():
    names = hosts(4)
    v = judge(names, results(names, with_host("node2", (0.0009, 500e6))))  # 4.5x, +0.7 ms
    assert v.slow == {} and v.bad_hosts == {}


def test_two_hosts_have_no_majority_and_nobody_is_judged():
    names = hosts(2)
    v = judge(names, results(names, lambda pair: NIC_100MBIT))
    assert v.bad_hosts == {} and v.bad_links == {}
    assert v.note is not None and "no majority" in v.note
    assert v.typical_bandwidth_Bps == 11e6  # the figures are still there


def test_half_the_hosts_slow_is_not_the_hosts_fault():
    names = hosts(4)
    v = judge(
        names, results(names, lambda pair: "refused" if pair != ("node1", "node2") else HEALTHY)
    )
    assert v.bad_hosts == {} and v.note is not None and "nobody is left out" in v.note


def test_no_figures_at_all():
    names = hosts(4)
    v = judge(names, results(names, lambda pair: "no report"))
    assert v.typical_latency_s is None and v.bad_hosts == {} and v.note is not None
