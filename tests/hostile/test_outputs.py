"""Files a user asks for in a directory others can write (issue 34, item 4): `inspect --html/--png`
into a shared /tmp-like directory used to follow a link planted at the name and overwrite its
target. Now a link or another user's file at the name is refused in one line (exit 2) and left
as it was; our own file is replaced whole (temp + rename), with no temporary file left over.
The planting is done by another user, for real (`nobody`, through setpriv)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ftrun.errors import UsageError
from ftrun.outputs import write_output
from tests.hostile.clidriver import ftrun_cli
from tests.hostile.otheruser import OTHER_UID, as_other, shared_tree, sticky_dir
from tests.hostile.test_cli_text import write_job


def a_job(run_dir: Path) -> None:
    t = time.time()
    write_job(
        run_dir,
        "job1",
        [
            {"t": t, "kind": "job_started", "name": "j", "hosts": ["h"], "spares": []},
            {"t": t + 1, "kind": "generation_launched", "gen": 1, "hosts": ["h"], "world_size": 1},
            {"t": t + 2, "kind": "job_finished", "state": "succeeded", "reason": "done"},
        ],
    )


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("plant", ["link", "other user's file"])
def test_inspect_html_does_not_write_through_what_another_user_planted(tmp_path: Path, plant):
    run_dir = tmp_path / "runs"
    a_job(run_dir)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    with shared_tree() as shared:
        tmp = sticky_dir(shared)
        target = tmp / "timeline.html"
        if plant == "link":
            as_other(f"ln -s {victim} {target}")
            why = "it is a symbolic link"
        else:
            as_other(f"echo theirs > {target}")
            why = f"it is owned by uid {OTHER_UID}"
        run = ftrun_cli(["inspect", "job1", "--html", str(target)], {"FTRUN_RUN_DIR": str(run_dir)})
        assert run.code == 2 and run.clean, run.output
        errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and run.stderr.count("hint:") == 1, run.stderr
        assert errors[0].startswith(f"error: --html {target} is not replaced: {why}")
        assert victim.read_text() == "precious\n"
        assert target.is_symlink() if plant == "link" else target.read_text() == "theirs\n"
        assert target.lstat().st_uid == OTHER_UID
        assert leftovers(tmp) == []


def test_inspect_pictures_replace_our_own_file_whole(tmp_path: Path):
    run_dir = tmp_path / "runs"
    a_job(run_dir)
    with shared_tree() as shared:
        tmp = sticky_dir(shared)
        page = tmp / "timeline.html"
        page.write_text("an older page")
        inode = page.stat().st_ino
        run = ftrun_cli(["inspect", "job1", "--html", str(page)], {"FTRUN_RUN_DIR": str(run_dir)})
        assert run.code == 0, run.output
        assert page.read_text().startswith("<!DOCTYPE html>") and page.stat().st_ino != inode
        assert leftovers(tmp) == []


def test_write_output_refusals_and_the_system_errors(tmp_path: Path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "link").symlink_to(victim)
    with pytest.raises(UsageError) as caught:
        write_output(tmp_path / "link", b"x", flag="--out")
    assert "--out" in caught.value.message and "symbolic link" in caught.value.message
    assert victim.read_text() == "precious\n"
    with pytest.raises(IsADirectoryError):
        write_output(tmp_path, b"x")
    with pytest.raises(FileNotFoundError):
        write_output(tmp_path / "missing" / "out.json", b"x")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UsageError, match="not a regular file"):
        write_output(tmp_path / "fifo", b"x")
    assert write_output(tmp_path / "new.json", b"{}") == tmp_path / "new.json"
    assert (tmp_path / "new.json").read_bytes() == b"{}"
    assert leftovers(tmp_path) == []


def test_simulate_keep_into_a_directory_others_can_write_is_refused(tmp_path: Path):
    from tests.unit.test_sim import SMALL_4

    trace = tmp_path / "trace.csv"
    trace.write_text(SMALL_4)
    with shared_tree() as shared:
        open_dir = shared / "open"
        open_dir.mkdir()
        os.chmod(open_dir, 0o777)  # not sticky: anyone could swap the journals kept here
        run = ftrun_cli(["simulate", str(trace), "--keep", str(open_dir)])
        assert run.code == 2 and run.clean, run.output
        assert f"the run directory {open_dir} is not safe to use" in run.stderr
        assert list(open_dir.iterdir()) == []
