"""Table-driven tests of the fault policy."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ftrun.controller.evidence import Evidence
from ftrun.controller.policy import History, Tier, backoff_s, classify

KILLED = Evidence(kind="crash", host="h", rank=1, signal="SIGKILL", step=40)
RAISED = Evidence(kind="crash", host="h", rank=0, exit_code=1, exception="ValueError: boom", step=7)

CASES = [
    ("host lost", Evidence(kind="host-lost", host="h"), History(), Tier.REPLACE_NODE),
    ("first crash", KILLED, History(ever_progressed=True), Tier.RESTART_IN_PLACE),
    (
        "import error before any step",
        Evidence(
            kind="crash", rank=0, exit_code=1, exception="ModuleNotFoundError: No module named 'x'"
        ),
        History(),
        Tier.FATAL,
    ),
    (
        "import error after progress is restartable (e.g. a flaky filesystem)",
        Evidence(kind="crash", rank=0, exit_code=1, exception="ImportError: x"),
        History(ever_progressed=True),
        Tier.RESTART_IN_PLACE,
    ),
    (
        "bad arguments before any step",
        Evidence(kind="crash", rank=0, exit_code=2, usage_error=True),
        History(),
        Tier.FATAL,
    ),
    (
        "a signal before the first step is transient",
        Evidence(kind="crash", rank=0, signal="SIGKILL"),
        History(),
        Tier.RESTART_IN_PLACE,
    ),
    (
        "same failure twice without progress",
        RAISED,
        History(ever_progressed=True, previous=RAISED, restarts_used=1),
        Tier.FATAL,
    ),
    (
        "same failure twice with progress in between",
        RAISED,
        History(
            ever_progressed=True, previous=RAISED, progressed_since_previous=True, restarts_used=1
        ),
        Tier.RESTART_IN_PLACE,
    ),
    (
        "the same failure from another rank: which rank reports it first is a race",
        RAISED,
        History(ever_progressed=True, previous=replace(RAISED, rank=1), restarts_used=1),
        Tier.FATAL,
    ),
    (
        "a different failure",
        KILLED,
        History(ever_progressed=True, previous=RAISED, restarts_used=1),
        Tier.RESTART_IN_PLACE,
    ),
    ("budget spent", KILLED, History(ever_progressed=True, restarts_used=3), Tier.FATAL),
    (
        "a hang restarts in place",
        Evidence(kind="hang", host="h", rank=0, step=9),
        History(ever_progressed=True),
        Tier.RESTART_IN_PLACE,
    ),
    (
        "an ECC error needs another host",
        Evidence(
            kind="crash",
            host="h",
            rank=0,
            exit_code=1,
            log_tail=("RuntimeError: CUDA error: uncorrectable ECC error encountered",),
        ),
        History(ever_progressed=True),
        Tier.REPLACE_NODE,
    ),
    (
        "an OOM at the same step twice is fatal",
        Evidence(
            kind="crash",
            rank=0,
            exit_code=1,
            exception="torch.OutOfMemoryError: CUDA out of memory",
            step=3,
        ),
        History(
            ever_progressed=True,
            restarts_used=1,
            previous=Evidence(
                kind="crash",
                rank=0,
                exit_code=1,
                exception="torch.OutOfMemoryError: CUDA out of memory",
                step=3,
            ),
        ),
        Tier.FATAL,
    ),
    (
        "a crash after a rank exited 0: the work is done, no restart",
        KILLED,
        History(ever_progressed=True, work_done_by=0),
        Tier.FATAL,
    ),
    (
        "even one a rule would send to another host",
        Evidence(kind="host-lost", host="h"),
        History(work_done_by=3),
        Tier.FATAL,
    ),
    (
        "an idle hang restarts in place like any hang",
        Evidence(kind="hang", host="h", rank=0, note="idle: no CPU and no output for 1800 s"),
        History(),
        Tier.RESTART_IN_PLACE,
    ),
    (
        "the same idle hang twice is fatal",
        Evidence(kind="hang", host="h", rank=0, note="idle: no CPU and no output for 1801 s"),
        History(
            restarts_used=1,
            previous=Evidence(
                kind="hang", host="h", rank=0, note="idle: no CPU and no output for 1800 s"
            ),
        ),
        Tier.FATAL,
    ),
]


@pytest.mark.parametrize("name, evidence, history, tier", CASES, ids=[c[0] for c in CASES])
def test_classify(name, evidence, history, tier):
    decision = classify(evidence, history, max_restarts=3)
    assert decision.tier is tier, decision.reason
    assert decision.reason


@pytest.mark.parametrize("failures, expected", [(0, 0), (1, 0), (2, 1), (3, 2), (4, 4), (10, 30)])
def test_backoff_is_immediate_then_exponential_with_cap(failures, expected):
    assert backoff_s(failures, base_s=1, cap_s=30) == expected


def test_exception_type_strips_module_path():
    ev = Evidence(kind="crash", exception="torch.distributed.DistBackendError: timeout")
    assert ev.exception_type == "DistBackendError"


def test_work_done_names_the_clean_rank_and_an_idle_hang_says_so():
    decision = classify(KILLED, History(work_done_by=0), max_restarts=3)
    assert decision.rule == "work done" and "after rank 0 had exited 0" in decision.reason
    idle = Evidence(kind="hang", host="h", rank=0, note="idle: no CPU and no output for 60 s")
    assert (
        "(idle: no CPU and no output for 60 s)" in classify(idle, History(), max_restarts=3).reason
    )
