"""Table-driven tests of the agent's idle tracking (agent/idle.py), on an injected clock, and of
the CPU sampling on real processes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ftrun.agent.idle import IdleGuard, IdleTracker, report_after_s, sample_cpu, sample_interval_s

# Samples of one rank, one a second: (cpu seconds so far, log bytes so far, exempt).
# The rank is idle since the last sample that showed CPU (> 2 % of a core), output or exemption.
RANK = [
    ("no CPU, no output", [(1.0, 10, False)] * 6, 5.0),
    ("1 % of a core is idle", [(1.0 + 0.01 * i, 10, False) for i in range(6)], 5.0),
    ("5 % of a core is busy", [(1.0 + 0.05 * i, 10, False) for i in range(6)], 0.0),
    ("a burst of CPU at t=3", [(1.0, 0, False)] * 3 + [(2.0, 0, False)] * 3, 2.0),
    ("a line of output at t=2", [(1.0, 0, False)] * 2 + [(1.0, 80, False)] * 4, 3.0),
    ("in a section, or stepping", [(1.0, 0, False)] * 4 + [(1.0, 0, True)] * 2, 0.0),
    (
        "a child reaped into the rank's total",
        [(5.0, 0, False), (4.0, 0, False), (4.0, 0, False)],
        2.0,
    ),
]


@pytest.mark.parametrize("name, samples, idle_s", RANK, ids=[c[0] for c in RANK])
def test_rank_idle_since(name, samples, idle_s):
    t = IdleTracker()
    for now, (cpu, out, exempt) in enumerate(samples):
        t.observe(0, float(now), cpu_s=cpu, out_bytes=out, exempt=exempt)
    now = float(len(samples) - 1)
    assert t.host_idle(now, {0}, min_s=0.0) == {0: pytest.approx(idle_s)}


@pytest.mark.parametrize(
    "name, live, min_s, expected",
    [
        ("every rank idle long enough", {0, 1}, 3.0, {0: 5.0, 1: 3.0}),
        ("one not long enough", {0, 1}, 4.0, None),
        ("a live rank not sampled yet", {0, 1, 2}, 0.0, None),
        ("no live rank", set(), 0.0, None),
    ],
)
def test_host_idle_needs_every_live_rank(name, live, min_s, expected):
    t = IdleTracker()
    t.observe(0, 0.0, cpu_s=0.0, out_bytes=0)
    t.observe(1, 0.0, cpu_s=0.0, out_bytes=0)
    t.observe(1, 2.0, cpu_s=0.0, out_bytes=5)  # rank 1 wrote something at t=2
    t.observe(0, 5.0, cpu_s=0.0, out_bytes=0)
    t.observe(1, 5.0, cpu_s=0.0, out_bytes=5)
    assert t.host_idle(5.0, live, min_s=min_s) == expected


def test_guard_reports_only_when_the_host_flips():
    g = IdleGuard(timeout_s=8.0)  # reports after 2 s of every rank idle
    assert report_after_s(8.0) == 2.0
    said = []
    for now, out in [(0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (5, 9), (6, 9), (7, 9), (8, 9)]:
        tell, ranks = g.update(
            float(now), {0: 1.0, 1: 1.0}, {0: out, 1: 0}, exempt=set(), finishing=False
        )
        if tell:
            said.append((now, None if ranks is None else sorted(ranks)))
    assert said == [(2, [0, 1]), (5, None), (7, [0, 1])]
    # Finishing (a rank of the generation exited 0): busy, whatever the samples say.
    assert g.update(9.0, {0: 1.0, 1: 1.0}, {0: 9, 1: 0}, exempt=set(), finishing=True) == (
        True,
        None,
    )
    # A rank that exits is forgotten; the rest decide.
    g2 = IdleGuard(timeout_s=8.0)
    g2.update(0.0, {0: 0.0, 1: 0.0}, {}, exempt={1}, finishing=False)
    assert g2.update(3.0, {0: 0.0}, {}, exempt=set(), finishing=False) == (True, {0: 3.0})


@pytest.mark.parametrize(
    "timeout, interval, after",
    [(1800.0, 5.0, 60.0), (60.0, 3.0, 15.0), (2.0, 0.25, 0.5), (0.5, 0.25, 0.5)],
)
def test_sampling_and_report_hysteresis_scale_with_the_window(timeout, interval, after):
    assert (sample_interval_s(timeout), report_after_s(timeout)) == (interval, after)


def test_sample_cpu_counts_the_live_process_tree():
    """A live child's CPU counts for its parent (a rank's data-loader workers)."""
    burn = (
        "import sys, time\nend = time.process_time() + 0.5\n"
        "while time.process_time() < end: pass\nprint('burnt', flush=True)\nsys.stdin.read()"
    )
    # The parent starts the child and waits on stdin; the child burns 0.5 s, then waits too.
    code = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {burn!r}]); sys.stdin.read()"
    parent = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout.readline() == "burnt\n"  # bounded by the pytest timeout
        assert sample_cpu({0: parent.pid})[0] >= 0.45
        assert sample_cpu({1: 2**22 + 7}) == {}  # no such process: left out
    finally:
        parent.communicate("", timeout=10)
