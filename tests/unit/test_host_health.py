from ftrun.controller.evidence import Evidence
from ftrun.controller.host_health import HostHealth, QuarantinePolicy
from ftrun.controller.policy import Decision, Tier


def test_repeated_failures_in_a_window_quarantine_a_host_until_expiry():
    h = HostHealth(QuarantinePolicy(failures=2, window_s=60, expiry_s=100))
    assert not h.record_failure("a", 0.0)
    assert not h.record_failure("a", 70.0)  # the first one fell out of the window
    assert h.record_failure("a", 80.0)
    assert h.quarantined("a", 100.0) and not h.quarantined("b", 100.0)
    assert not h.quarantined("a", 181.0)  # expired, and its history forgiven
    assert h.recent_failures("a") == 0


RESTART = Decision(Tier.RESTART_IN_PLACE, "restarting in place", "any other failure")
CRASH = Evidence(kind="crash", host="a", rank=0, exit_code=1)


def test_a_quarantined_host_turns_a_restart_in_place_into_a_replacement():
    h = HostHealth(QuarantinePolicy(failures=2, window_s=60, expiry_s=100))
    assert h.judge(CRASH, RESTART, now=0.0, wall_t=1000.0) == (RESTART, [])
    decision, events = h.judge(CRASH, RESTART, now=10.0, wall_t=1010.0)
    assert (decision.tier, decision.rule) == (Tier.REPLACE_NODE, "quarantine")
    assert "host a is quarantined for 100 s after 2 failures within 60 s" in decision.reason
    assert events == [{"host": "a", "failures": 2, "window_s": 60, "until_t": 1110.0}]


def test_a_lost_host_is_benched_and_fatal_or_hostless_failures_do_not_count():
    h = HostHealth(QuarantinePolicy(failures=3))
    replace = Decision(Tier.REPLACE_NODE, "lost", "host lost")
    lost = Evidence(kind="host-lost", host="b")
    assert h.judge(lost, replace, now=0.0, wall_t=0.0) == (
        replace,
        [{"host": "b", "until": "its agent is back", "failures": 1}],
    )
    fatal = Decision(Tier.FATAL, "bad", "before first step")
    assert h.judge(CRASH, fatal, now=1.0, wall_t=1.0) == (fatal, [])
    assert h.judge(Evidence(kind="crash"), RESTART, now=1.0, wall_t=1.0) == (RESTART, [])
    assert h.recent_failures("a") == 0 and h.recent_failures("b") == 1
