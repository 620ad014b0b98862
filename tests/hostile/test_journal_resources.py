"""The journal when the machine runs short: no file descriptor left (EMFILE), no disk (ENOSPC, on
a real 1 MiB tmpfs), and stream names that try to leave the job directory. The controller must
never raise for it, and the journal must always get its last event."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftrun.journal import RESERVE_FILE, Journal
from ftrun.journal.read import read_events


def events_of(job_dir: Path) -> list[dict]:
    return read_events(job_dir)


@contextlib.contextmanager
def no_file_descriptors_left() -> Iterator[None]:
    """Use up this process's file descriptors (under a lowered soft limit), then give them back."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 16, hard))
    try:
        while True:
            try:
                held.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                break
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_without_file_descriptors_log_lines_are_dropped_and_the_job_still_ends(tmp_path):
    journal = Journal(tmp_path / "job")
    journal.append_log(1, "rank0", ["before"])
    with no_file_descriptors_left():
        journal.append_log(1, "rank1", ["lost"])  # a new stream: its file cannot be opened
        journal.append_log(1, "rank1", ["lost too"])
        journal.append_log(1, "rank0", ["kept: its file was open"])
        journal.record("job_finished", state="succeeded")
    journal.close()
    kinds = [e["kind"] for e in events_of(tmp_path / "job")]
    assert kinds == ["log_write_failed", "job_finished", "log_lines_dropped"]
    failed, _, dropped = events_of(tmp_path / "job")
    assert failed["reason"] == "EMFILE" and failed["stream"] == "rank1"
    assert dropped["by_reason"] == {"EMFILE": 2}
    rank0 = (tmp_path / "job" / "logs" / "g1" / "rank0.log").read_text()
    assert rank0 == "before\nkept: its file was open\n"


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs (root only), unmounted after the test."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


def test_a_full_disk_stops_rank_logs_and_the_reserve_keeps_the_last_events(tiny_disk):
    job = tiny_disk / "job"
    journal = Journal(job)
    assert (job / RESERVE_FILE).stat().st_size > 0
    journal.record("job_started")
    fill(tiny_disk / "hog")  # someone else's file takes the rest of the disk
    for i in range(200):  # a chatty rank: the disk is full
        journal.append_log(1, "rank0", [f"line {i} " + "x" * 200])
    for i in range(50):
        journal.record("progress", gen=1, step=i)
    journal.record("job_finished", state="succeeded")
    journal.close()
    events = events_of(job)
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "job_started" and kinds[-2:] == ["job_finished", "log_lines_dropped"]
    assert "logs_stopped" in kinds and kinds.count("progress") == 50
    assert not (job / RESERVE_FILE).exists()
    # Every line of events.jsonl is whole JSON: nothing torn by the full disk.
    for line in (job / "events.jsonl").read_text().splitlines():
        json.loads(line)


@pytest.mark.parametrize("stream", ["/../../x", "../x", ".hidden", "a/b", "rank\0", "", "..."])
def test_a_stream_name_never_leaves_the_generation_directory(tmp_path, stream):
    journal = Journal(tmp_path / "job")
    path = journal.log_path(3, stream)
    assert path.parent == tmp_path / "job" / "logs" / "g3"
    assert not path.name.startswith(".") and "/" not in path.name and "\0" not in path.name
    journal.append_log(3, stream, ["x"])
    journal.close()
    assert path.read_text() == "x\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job"]
