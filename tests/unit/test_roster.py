"""The Roster plans each generation's hosts: table-driven, no processes."""

from __future__ import annotations

import pytest

from ftrun.controller.roster import HostState, NotEnoughHosts, Roster


def ready_roster(hosts, spares=(), min_nodes=1) -> Roster:
    roster = Roster(hosts, spares, min_nodes=min_nodes)
    for host in [*hosts, *spares]:
        assert roster.ready(roster.new_agent(host))
    return roster


def test_first_plan_takes_the_hosts_in_order_and_leaves_spares_ready():
    roster = ready_roster(["a", "b", "c"], ["s"])
    assert roster.plan() == ["a", "b", "c"]
    assert roster.state("s") is HostState.READY and roster.state("a") is HostState.ACTIVE


def test_a_spare_at_start_fills_in_for_an_unreachable_host():
    roster = Roster(["a", "b"], ["s"])
    for host in ("a", "s"):
        roster.ready(roster.new_agent(host))
    roster.new_agent("b")
    roster.lost("b")
    assert roster.plan() == ["a", "s"]


@pytest.mark.parametrize(
    "lost, spares, expected",
    [
        ("b", ["s"], ["a", "s", "c"]),  # the spare takes the lost host's node rank
        ("a", ["s"], ["s", "b", "c"]),  # node rank 0 too: the survivors keep theirs
        ("b", [], ["a", "c"]),  # no spare: shrink
    ],
)
def test_replan_after_a_lost_host(lost, spares, expected):
    roster = ready_roster(["a", "b", "c"], spares)
    roster.plan()
    roster.lost(lost)
    assert roster.needs_replacing() == [lost]
    assert roster.plan() == expected


def test_below_min_nodes_there_is_no_plan():
    roster = ready_roster(["a", "b", "c"], min_nodes=3)
    roster.plan()
    roster.lost("c")
    with pytest.raises(NotEnoughHosts) as e:
        roster.plan()
    assert e.value.usable == ["a", "b"] and e.value.min_nodes == 3


def test_excluded_hosts_are_not_planned():
    roster = ready_roster(["a", "b"], ["s"])
    assert roster.plan(excluded=lambda h: h == "a") == ["b", "s"]


def test_a_returning_host_grows_a_shrunken_job_but_never_beyond_its_size():
    roster = ready_roster(["a", "b", "c"])
    roster.plan()
    roster.lost("c")
    assert roster.plan() == ["a", "b"] and roster.can_grow() == []
    agent = roster.new_agent("c")
    assert roster.can_grow() == []  # still starting
    assert roster.ready(agent)
    assert roster.can_grow() == ["c"]
    assert roster.plan() == ["a", "b", "c"] and roster.can_grow() == []


def test_an_old_incarnation_is_not_the_hosts_agent():
    roster = ready_roster(["a"])
    old = roster.slots["a"].agent_id
    roster.lost("a")
    new = roster.new_agent("a")
    assert roster.host_of(old) is None and roster.host_of(new) == "a"
    assert not roster.ready(old)


def test_removed_hosts_are_replaced_and_can_be_added_back():
    roster = ready_roster(["a", "b"], ["s"])
    roster.plan()
    assert roster.remove("b") is HostState.ACTIVE
    assert roster.needs_replacing() == ["b"]
    assert roster.plan() == ["a", "s"]
    roster.add("b")
    assert roster.ready(roster.new_agent("b"))
    assert roster.state("b") is HostState.READY  # a spare now: the job has its two hosts


def test_a_host_back_right_after_its_loss_comes_after_the_spares():
    roster = ready_roster(["a", "b", "c"], ["s"])
    roster.plan()
    roster.lost("c")
    assert roster.ready(roster.new_agent("c"))  # a partition that healed at once
    assert roster.plan() == ["a", "b", "s"]
    roster.lost("s")
    assert roster.plan() == ["a", "b", "c"]  # no spare left: better than shrinking


def test_without_a_spare_a_host_back_at_once_keeps_the_job_whole():
    roster = ready_roster(["a", "b"])
    roster.plan()
    roster.lost("a")
    assert roster.ready(roster.new_agent("a"))
    assert roster.plan() == ["a", "b"]  # back in its place


def test_max_nodes_lets_added_hosts_grow_the_job_beyond_its_launch_hosts():
    roster = Roster(["a"], min_nodes=1, max_nodes=3)
    for host in ("a",):
        roster.ready(roster.new_agent(host))
    assert roster.plan() == ["a"]
    for host in ("b", "c", "d"):
        roster.add(host)
        roster.ready(roster.new_agent(host))
    assert roster.can_grow() == ["b", "c"]  # up to --max-nodes; d waits as a spare
    assert roster.plan() == ["a", "b", "c"]
    assert roster.state("d") is HostState.READY
