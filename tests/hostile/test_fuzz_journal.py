"""Fuzzing the journal reader: `events.jsonl` as arbitrary bytes, and as JSON lines of real
event kinds whose fields hold arbitrary values (right types mostly, so that the fold is reached,
any JSON value sometimes). `read_journal` and `load_job` raise nothing for a file they can
open; `status`, `status --json` and `inspect` show the job (marked damaged when lines were
skipped) and exit 0, with no internal error and no traceback."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftrun.jobview import load_job
from ftrun.journal.read import read_journal
from tests.hostile.clidriver import ftrun_cli

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

KINDS = [
    "job_started",
    "plan_chosen",
    "generation_launched",
    "first_step",
    "progress",
    "fault_detected",
    "fault_classified",
    "torn_down",
    "restart",
    "resumed",
    "generation_ended",
    "job_finished",
    "agent_connected",
    "host_unreachable",
    "host_removed",
    "host_added",
]
HOSTILE = st.sampled_from(["[/]", "[bold]x", "\x1b[2J", "\x00", "host-lost", "\u202e", ""])
TEXT = st.one_of(st.text(max_size=12), HOSTILE)
JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), TEXT),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
SMALL = st.one_of(st.none(), st.integers(min_value=-2, max_value=4), st.integers())
TIME = st.floats(min_value=0, max_value=2e9)
TYPED = {
    "t": TIME,
    "fault_t": TIME,
    "detected_t": TIME,
    "controller_create_time": TIME,
    "gen": SMALL,
    "incident": SMALL,
    "rank": SMALL,
    "step": SMALL,
    "exit_code": SMALL,
    "clean_rank": SMALL,
    "run": SMALL,
    "world_size": SMALL,
    "controller_pid": SMALL,
    "slurm_restart_count": SMALL,
    "allowance_s": TIME,
    "idle_s": TIME,
    "past_allowance_s": TIME,
    "predicted_step_s": TIME,
    "name": TEXT,
    "host": TEXT,
    "signal": TEXT,
    "exception": TEXT,
    "traceback": TEXT,
    "reason": TEXT,
    "tier": TEXT,
    "state": TEXT,
    "fault": st.sampled_from(["crash", "hang", "exit_hang", "host-lost", "preempted", "x"]),
    "section": TEXT,
    "summary": TEXT,
    "why": TEXT,
    "outcome": TEXT,
    "injected": TEXT,
    "hosts": st.lists(TEXT, max_size=3),
    "spares": st.lists(TEXT, max_size=2),
    "tail": st.lists(TEXT, max_size=3),
    "stacks_missing_from": st.lists(TEXT, max_size=2),
    "stacks": st.dictionaries(TEXT, TEXT, max_size=2),
    "states": st.dictionaries(TEXT, TEXT, max_size=2),
    "root_cause": st.dictionaries(
        st.sampled_from(
            [
                "kind",
                "rank",
                "host",
                "signal",
                "exit_code",
                "exception",
                "traceback",
                "tail",
                "log",
                "task",
                "traceback_source",
                "generation",
            ]
        ),
        JSON,
        max_size=6,
    ),
}


@st.composite
def event(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(sorted(TYPED)), max_size=8, unique=True))
    out: dict[str, Any] = {"kind": draw(st.one_of(st.sampled_from(KINDS), TEXT))}
    for name in names:
        out[name] = draw(st.one_of(TYPED[name], TYPED[name], TYPED[name], JSON))
    return out


def line(ev: Any) -> bytes:
    return json.dumps(ev).encode() + b"\n"


EVENTS = st.lists(st.one_of(event(), event(), JSON).map(line), max_size=12).map(b"".join)
NOISE = st.lists(
    st.one_of(st.binary(max_size=40), st.sampled_from([b"\n", b"\xff", b"\x00", b"[1]\n"])),
    max_size=6,
).map(b"".join)
JOURNAL = st.one_of(EVENTS, st.tuples(EVENTS, NOISE, EVENTS).map(b"".join), st.binary(max_size=400))


def shows(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        job_dir = Path(tmp) / "job-1"
        job_dir.mkdir()
        (job_dir / "events.jsonl").write_bytes(data)
        read = read_journal(job_dir)
        assert read.bad_lines == 0 or read.damage
        view = load_job(job_dir)
        json.dumps(view.to_json(detail=True), allow_nan=False)
        for args in (["status"], ["status", "--json"], ["status", "job-1"], ["inspect", "job-1"]):
            run = ftrun_cli([*args, "--run-dir", tmp])
            assert run.code == 0 and "internal error" not in run.stderr, (args, run.output)
            assert "\x1b" not in run.output and "\u202e" not in run.output
            assert "job-1" in run.stdout


def test_a_bad_controller_pid_is_not_a_live_controller(tmp_path: Path):
    """Found by the fuzz below: psutil raises ValueError for a pid of 0 or less."""
    for pid in (-2, 0, 2**70):
        line_ = {"t": 1.0, "kind": "job_started", "controller_pid": pid}
        (tmp_path / "events.jsonl").write_bytes(line(line_))
        assert load_job(tmp_path).state == "failed"


@FUZZ
@given(JOURNAL)
def test_journal_of_arbitrary_events_and_bytes(data: bytes):
    shows(data)
