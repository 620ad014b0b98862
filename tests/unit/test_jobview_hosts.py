"""Host states as `ftrun status` shows them, folded from the journal alone."""

from __future__ import annotations

from ftrun.jobview import fold_hosts


def test_spare_replaces_a_lost_host_which_comes_back_as_a_spare():
    events = [
        {"kind": "job_started", "hosts": ["a", "b", "c"], "spares": ["s"]},
        *({"kind": "agent_connected", "host": h} for h in ("a", "b", "c", "s")),
        {"kind": "generation_launched", "gen": 1, "hosts": ["a", "b", "c"]},
    ]
    assert fold_hosts(events) == {"a": "active", "b": "active", "c": "active", "s": "spare"}
    events += [
        {"kind": "fault_detected", "fault": "host-lost", "host": "c"},
        {"kind": "host_unreachable", "host": "c", "retry": True},
        {"kind": "generation_launched", "gen": 2, "hosts": ["a", "b", "s"]},
    ]
    assert fold_hosts(events) == {"a": "active", "b": "active", "c": "unreachable", "s": "active"}
    events += [
        {"kind": "agent_connected", "host": "c"},
        {"kind": "host_removed", "host": "a"},
        {"kind": "generation_launched", "gen": 3, "hosts": ["b", "s", "c"]},
    ]
    assert fold_hosts(events) == {"a": "removed", "b": "active", "c": "active", "s": "active"}


def test_a_crashed_rank_does_not_change_host_states():
    events = [
        {"kind": "job_started", "hosts": ["localhost"], "spares": []},
        {"kind": "agent_connected", "host": "localhost"},
        {"kind": "generation_launched", "gen": 1, "hosts": ["localhost"]},
        {"kind": "fault_detected", "fault": "crash", "host": "localhost"},
        {"kind": "generation_launched", "gen": 2, "hosts": ["localhost"]},
    ]
    assert fold_hosts(events) == {"localhost": "active"}
