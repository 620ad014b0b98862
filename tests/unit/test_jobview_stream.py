"""The journal folded as it streams, and from the controller's summary on (issue 34, item 6):
the same view as a fold of the whole journal, from a summary taken at any line; only the bytes
past the summary are read; a summary that does not match its journal is not used; memory stays
bounded however many steps the journal holds."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from ftrun.jobview import load_job
from ftrun.jobview.fold import JobFolder
from ftrun.jobview.goodput import job_goodput
from ftrun.jobview.keeper import SummaryKeeper
from ftrun.jobview.series import MAX_POINTS_PER_GENERATION, RATE_POINTS
from ftrun.jobview.summary import SUMMARY_FILE, read_summary
from ftrun.jobview.timeline import build_timeline
from ftrun.journal.read import JournalParser, stream_journal

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import longjournal

NOW = longjournal.T0 + 10**6


def everything(job_dir: Path, *, summary: bool = True) -> dict[str, Any]:
    """What status, inspect and the timeline show of the job, as JSON."""
    view = load_job(job_dir, summary=summary)
    return {
        "view": view.to_json(detail=True),
        "goodput": job_goodput(view, now=NOW).to_json(),
        "timeline": build_timeline(view, now=NOW).to_json(),
    }


def a_long_job(tmp_path: Path, size: int = 400_000) -> tuple[Path, bytes]:
    job_dir = tmp_path / "runs" / "long-1"
    job_dir.mkdir(parents=True, mode=0o700)
    os.chmod(tmp_path / "runs", 0o700)
    path = job_dir / "events.jsonl"
    longjournal.write_journal(path, size, incident_every_s=300)
    return job_dir, path.read_bytes()


def line_starts(data: bytes) -> list[int]:
    return [0] + [i + 1 for i, b in enumerate(data) if b == 0x0A][:-1]


def summarized_at(job_dir: Path, data: bytes, cut: int) -> None:
    """The journal as it was at byte `cut`, summarized by the controller's keeper, then grown
    to its whole length (the same file: the summary still matches it)."""
    path = job_dir / "events.jsonl"
    path.write_bytes(data[:cut])
    keeper = SummaryKeeper(job_dir)
    keeper.round()
    keeper.stop()
    with open(path, "ab") as f:
        f.write(data[cut:])


def test_a_summary_taken_at_any_line_gives_the_whole_folds_view(tmp_path: Path) -> None:
    job_dir, data = a_long_job(tmp_path)
    whole = everything(job_dir, summary=False)
    assert whole["view"]["restarts"] >= 3 and whole["view"]["state"] == "succeeded"
    starts = line_starts(data)
    for cut in (starts[1], starts[len(starts) // 3], starts[-40], starts[-1], len(data)):
        summarized_at(job_dir, data, cut)
        assert read_summary(job_dir) is not None
        assert everything(job_dir) == whole, cut


def test_only_the_journal_past_the_summary_is_read(tmp_path: Path) -> None:
    job_dir, data = a_long_job(tmp_path)
    whole = everything(job_dir, summary=False)
    summarized_at(job_dir, data, len(data))
    # Overwrite what the summary covers, in place (same file, same length): a reader that
    # read it would see 1,000s of bad lines; one that starts at the summary sees none.
    with open(job_dir / "events.jsonl", "r+b") as f:
        f.write(b"".join(b"x" * (len(line) - 1) + b"\n" for line in data.splitlines(True)))
    assert everything(job_dir) == whole
    assert load_job(job_dir, summary=False).damaged is not None
    with open(job_dir / "events.jsonl", "ab") as f:  # and what comes after it is folded on
        f.write(b'{"t": %f, "kind": "job_started", "run": 2}\n' % (NOW - 5))
    view = load_job(job_dir)
    assert view.runs == 2 and view.ended_t is None and view.damaged is None


@pytest.mark.parametrize("how", ["replaced", "truncated", "garbled", "a link", "a fifo"])
def test_a_summary_that_does_not_match_its_journal_is_not_used(tmp_path: Path, how: str) -> None:
    job_dir, data = a_long_job(tmp_path)
    summarized_at(job_dir, data, len(data))
    journal, summary = job_dir / "events.jsonl", job_dir / SUMMARY_FILE
    if how == "replaced":  # another file by the same name: the summary is of the old one
        short = data[: line_starts(data)[200]]
        (job_dir / "new").write_bytes(short)
        os.replace(job_dir / "new", journal)
    elif how == "truncated":
        with open(journal, "r+b") as f:
            f.truncate(line_starts(data)[200])
    elif how == "garbled":
        summary.write_bytes(summary.read_bytes()[:-100])
    elif how == "a link":
        os.replace(summary, job_dir / "elsewhere.json")
        summary.symlink_to(job_dir / "elsewhere.json")
    else:
        summary.unlink()
        os.mkfifo(summary)  # opened without blocking, and not read: not a regular file
    assert read_summary(job_dir) is None
    assert everything(job_dir) == everything(job_dir, summary=False)


def test_the_keeper_writes_when_the_journal_grew_and_as_readable_as_the_journal(
    tmp_path: Path,
) -> None:
    job_dir, data = a_long_job(tmp_path, 50_000)
    os.chmod(job_dir / "events.jsonl", 0o640)
    views: list[Any] = []
    keeper = SummaryKeeper(job_dir, on_view=views.append)
    keeper.round()
    summary = job_dir / SUMMARY_FILE
    first = summary.stat()
    assert stat.S_IMODE(first.st_mode) == 0o640
    keeper.round()  # nothing new: not written again
    assert summary.stat().st_ino == first.st_ino
    with open(job_dir / "events.jsonl", "ab") as f:
        f.write(b'{"t": %f, "kind": "stop_requested"}\n' % (NOW - 1))
    keeper.stop()
    assert summary.stat().st_ino != first.st_ino
    assert [v.events_read for v in views] == [views[0].events_read] * 2 + [views[0].events_read + 1]
    assert [p.name for p in job_dir.iterdir() if p.name.endswith(".tmp")] == []


def test_a_torn_last_line_is_read_once_the_writer_ends_it(tmp_path: Path) -> None:
    job_dir = tmp_path / "j"
    job_dir.mkdir()
    first = json.dumps({"t": 1.0, "kind": "job_started"}).encode() + b"\n"
    second = json.dumps({"t": 2.0, "kind": "progress", "gen": 1, "step": 5}).encode() + b"\n"
    (job_dir / "events.jsonl").write_bytes(first + second[:15])
    parser = JournalParser()
    assert [e["kind"] for e in stream_journal(job_dir, parser)] == ["job_started"]
    assert parser.offset == len(first) and parser.damage is None
    with open(job_dir / "events.jsonl", "ab") as f:
        f.write(second[15:])
    again = list(stream_journal(job_dir, parser, offset=parser.offset))
    assert [e["step"] for e in again] == [5] and parser.damage is None


def test_a_fold_of_many_steps_keeps_a_bounded_few(tmp_path: Path) -> None:
    folder = JobFolder()
    folder.feed({"t": 0.0, "kind": "job_started", "hosts": ["a"], "nproc_per_node": 1})
    folder.feed({"t": 0.5, "kind": "generation_launched", "gen": 1, "hosts": ["a"],
                 "world_size": 1})  # fmt: skip
    folder.feed({"t": 1.0, "kind": "first_step", "gen": 1, "step": 0})
    for i in range(1, 300_000):
        folder.feed({"t": 1.0 + i, "kind": "progress", "gen": 1, "step": i})
        folder.feed({"t": 1.5 + i, "kind": "checkpoint_committed", "gen": 1, "step": i})
    series = folder.series
    assert len(series.steps[1].items) <= 2 * (MAX_POINTS_PER_GENERATION + 1)
    assert len(series.commits.items) <= 2 * series.commits.limit
    assert len(series.recent) <= RATE_POINTS and len(folder.goodput.marks) == 3
    view = folder.view(tmp_path / "j", alive=True)
    points = build_timeline(view, now=1e6).generations[0].points
    assert len(points) == MAX_POINTS_PER_GENERATION and {p.rate for p in points} == {1.0}
    assert points[-1].step1 == 299_999
