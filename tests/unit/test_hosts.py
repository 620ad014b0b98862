from ftrun.controller.hosts import HostHealth, QuarantinePolicy


def test_repeated_failures_in_a_window_quarantine_a_host_until_expiry():
    h = HostHealth(QuarantinePolicy(failures=2, window_s=60, expiry_s=100))
    assert not h.record_failure("a", 0.0)
    assert not h.record_failure("a", 70.0)  # the first one fell out of the window
    assert h.record_failure("a", 80.0)
    assert h.quarantined("a", 100.0) and not h.quarantined("b", 100.0)
    assert not h.quarantined("a", 181.0)  # expired, and its history forgiven
    assert h.recent_failures("a") == 0
