"""Run and job directories another user could change (issue 34, item 1): a run directory they
made first or can write is refused in one line with a hint (exit 2), a job directory of theirs
(or open to their writes, or a link) too; inside a job directory nothing is written through a
link, a FIFO or another user's file. The other user is real: `nobody`, through setpriv."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from ftrun.errors import UsageError
from ftrun.jobfiles import JobDir, check_run_dir
from ftrun.journal import CONFIG_FILE, Journal
from tests.hostile.clidriver import ftrun_cli
from tests.hostile.otheruser import OTHER_UID, as_other, need_root, shared_tree, sticky_dir

SCRIPT = "import pathlib, sys; pathlib.Path(sys.argv[1]).write_text('ran')\n"


def refused_in_one_line(run, *needles: str) -> None:
    assert run.code == 2, run.output
    assert run.clean, run.output
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: ")
    for needle in needles:
        assert needle in lines[0], lines[0]


def launch_into(run_dir: Path, tmp_path: Path):
    script, marker = tmp_path / "s.py", tmp_path / "ran"
    script.write_text(SCRIPT)
    run = ftrun_cli(["launch", "--run-dir", str(run_dir), str(script), str(marker)])
    assert not marker.exists()
    return run


@pytest.mark.parametrize(
    "mode, why",
    [
        (0o777, "group or other users can write to it (and it is not sticky)"),
        (0o770, "group or other users can write to it (and it is not sticky)"),
        (0o722, "group or other users can write to it (and it is not sticky)"),
    ],
)
def test_a_run_dir_others_can_write_is_refused(tmp_path: Path, mode: int, why: str):
    run_dir = tmp_path / "runs"
    run_dir.mkdir()
    os.chmod(run_dir, mode)
    run = launch_into(run_dir, tmp_path)
    refused_in_one_line(run, f"the run directory {run_dir} is not safe to use: {why}")
    assert "--run-dir" in run.stderr.splitlines()[-1]
    assert list(run_dir.iterdir()) == []  # no job directory was made in it


def test_a_run_dir_another_user_made_first_is_refused(tmp_path: Path):
    with shared_tree() as shared:
        tmp = sticky_dir(shared)
        as_other(f"mkdir -m 700 {tmp}/runs && chmod 755 {tmp}/runs")  # theirs, before ours
        run = launch_into(tmp / "runs", tmp_path)
        refused_in_one_line(run, f"it is owned by uid {OTHER_UID}")
        as_other(f"chmod 1777 {tmp}/runs")  # sticky protects from everyone but its owner
        refused_in_one_line(launch_into(tmp / "runs", tmp_path), f"owned by uid {OTHER_UID}")
        assert list((tmp / "runs").iterdir()) == []


def test_a_sticky_run_dir_is_accepted_with_a_private_job_dir(tmp_path: Path):
    with shared_tree() as shared:
        tmp = sticky_dir(shared)
        check_run_dir(tmp)  # /tmp-like: root's, 1777
        with JobDir.open(tmp / "job1") as files:
            assert stat.S_IMODE(os.fstat(files.fd).st_mode) == 0o700
        # Nobody else can move it away now: the kernel's sticky rule, which the check relies on.
        moved = as_other_fails(f"mv {tmp}/job1 {tmp}/stolen")
        assert "Operation not permitted" in moved and (tmp / "job1").is_dir()


def as_other_fails(script: str) -> str:
    from tests.hostile.otheruser import attempt_as_other

    done = attempt_as_other(script)
    assert done.returncode != 0, f"as nobody, {script!r} worked"
    return done.stderr


@pytest.mark.parametrize("plant", ["other user's", "open to writes", "link"])
def test_a_job_dir_that_is_not_ours_alone_is_refused(tmp_path: Path, plant: str):
    with shared_tree() as shared:
        tmp = sticky_dir(shared)
        job = tmp / "job1"
        if plant == "other user's":  # made first, in a directory everyone may create in
            as_other(f"mkdir -m 755 {job}")
            why = f"it is owned by uid {OTHER_UID}"
        elif plant == "open to writes":
            job.mkdir()
            os.chmod(job, 0o777)
            why = "group or other users can write to it"
        else:
            as_other(f"mkdir -m 700 {tmp}/theirs && ln -s {tmp}/theirs {job}")
            why = "it is a symbolic link"
        with pytest.raises(UsageError) as caught:
            Journal(job, existing=True)
        assert f"the job directory {job} is not safe to use: {why}" in caught.value.message
        assert caught.value.exit_code == 2 and caught.value.hint
        assert not (tmp / "theirs" / "events.jsonl").exists()
        if plant != "link":
            assert not (job / "events.jsonl").exists()


def test_nothing_in_the_job_dir_is_written_through_a_link_or_a_fifo(tmp_path: Path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    journal = Journal(tmp_path / "runs" / "job1")
    job = journal.job_dir
    try:
        (job / "logs" / "g1").mkdir(parents=True)
        os.symlink(victim, job / "logs" / "g1" / "rank0.log")
        os.mkfifo(job / "logs" / "g1" / "rank1.log")  # no reader: a plain open would hang
        journal.append_log(1, "rank0", ["through the link"])
        journal.append_log(1, "rank1", ["into the fifo"])
        journal.append_log(1, "rank2", ["a log of its own"])
        os.symlink(tmp_path, job / "logs" / "g2")  # a linked directory is not followed either
        journal.append_log(2, "rank0", ["through the linked dir"])
        assert sorted(journal.dropped_log_lines.items()) == [
            ("ELOOP", 1),
            ("ENOTDIR", 1),
            ("ENXIO", 1),
        ]
        assert (job / "logs" / "g1" / "rank2.log").read_text() == "a log of its own\n"
        os.symlink(victim, job / CONFIG_FILE)  # replaced by a new file, not written through
        journal.write_config({"job_id": "job1"})
        assert stat.S_ISREG((job / CONFIG_FILE).lstat().st_mode)
        with pytest.raises(FileExistsError):
            journal.files.create_new(CONFIG_FILE)
    finally:
        journal.close()
    assert victim.read_text() == "precious\n"
    assert not list(tmp_path.glob("rank0.log"))
    assert [p.name for p in job.iterdir() if p.name.endswith(".tmp")] == []


def test_a_file_of_another_user_in_the_job_dir_is_not_appended_to(tmp_path: Path):
    need_root()
    with JobDir.open(tmp_path / "runs" / "job1") as files:
        os.close(files.create_new("agents/h.log"))
        os.chown(files.path / "agents" / "h.log", OTHER_UID, OTHER_UID)
        with pytest.raises(OSError) as caught:
            files.open_append("agents/h.log")
        assert caught.value.errno == errno.EPERM
