"""What `ftrun resume` reads before it starts the user's script as the user (issue 34, items 1
and 5): a job directory, config.json or journal that another user made or could change is
refused before it is read, and a config.json of the wrong shape is one line naming every bad
key (exit 2), never "internal error". `ftrun resume` runs as a real process, with the
checkpoint key exported as in the report: had it run the planted script, the marker would
exist."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Ftrun
from tests.hostile.otheruser import OTHER_UID, as_other, need_root, shared_tree, sticky_dir

KEY = "ab" * 32


def dead_job(job_dir: Path, script: Path, config: dict[str, Any] | None = None) -> None:
    """A job whose controller is gone (a pid that does not run), as `resume` expects one."""
    job_dir.mkdir(mode=0o700, parents=True)
    started = {"t": 1.0, "kind": "job_started", "job_id": job_dir.name, "hosts": ["localhost"]}
    started |= {"controller_pid": 2**22 + 7, "controller_create_time": 1.0}
    (job_dir / "events.jsonl").write_text(json.dumps(started) + "\n")
    saved = {"job_id": job_dir.name, "job_name": "j", "run_dir": str(job_dir.parent)}
    saved |= {"script": str(script), "script_args": [str(script.with_suffix(".ran"))]}
    saved |= config or {}
    (job_dir / "config.json").write_text(json.dumps(saved))
    os.chmod(job_dir / "events.jsonl", 0o600)
    os.chmod(job_dir / "config.json", 0o600)


def planted_script(where: Path) -> Path:
    script = where / "evil.py"
    script.write_text("import pathlib, sys; pathlib.Path(sys.argv[1]).write_text('ran')\n")
    os.chmod(script, 0o755)
    return script


def resume(run_dir: Path, test_id: str, job: str = "job1"):
    ftrun = Ftrun(run_dir, test_id)
    return ftrun.run("resume", job, timeout=60, env={"FTRUN_CHECKPOINT_KEY": KEY})


def refused(done, *needles: str) -> None:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr + done.stdout
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: ")
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_a_job_dir_another_user_put_in_place_is_not_resumed(test_id: str, no_survivors: None):
    """The report's attack: in a shared /tmp-like run directory, another user makes the job
    directory (config.json naming their script, a journal of a job whose controller died)."""
    with shared_tree() as shared:
        tmp = sticky_dir(shared)
        attacker = shared / "attacker"
        attacker.mkdir(mode=0o755)
        os.chmod(attacker, 0o755)  # whatever umask an in-process `ftrun launch` left
        script = planted_script(attacker)
        dead_job(attacker / "job1", script)
        for path in (attacker / "job1", *(attacker / "job1").iterdir()):
            os.chmod(path, 0o755)  # for nobody to copy
        as_other(f"cp -r {attacker / 'job1'} {tmp}/job1")
        assert (tmp / "job1").stat().st_uid == OTHER_UID
        done = resume(tmp, test_id)
        refused(done, f"the job directory {tmp / 'job1'} is not safe to use", f"uid {OTHER_UID}")
        assert not script.with_suffix(".ran").exists()
        assert not (tmp / "job1" / "control.json").exists()


@pytest.mark.parametrize("name", ["config.json", "events.jsonl"])
@pytest.mark.parametrize("plant", ["other user's", "group-writable", "link"])
def test_files_not_ours_alone_are_not_read(
    tmp_path: Path, test_id: str, no_survivors: None, name: str, plant: str
):
    need_root()
    run_dir = tmp_path / "runs"
    script = planted_script(tmp_path)
    dead_job(run_dir / "job1", script)
    path = run_dir / "job1" / name
    if plant == "other user's":
        os.chown(path, OTHER_UID, OTHER_UID)
        why = f"it is owned by uid {OTHER_UID}"
    elif plant == "group-writable":
        os.chmod(path, 0o620)
        why = "group or other users can write to it"
    else:
        real = tmp_path / name
        path.rename(real)
        path.symlink_to(real)
        why = "it is a symbolic link"
    done = resume(run_dir, test_id)
    refused(done, f"{path} is not safe to use: {why}")
    assert not script.with_suffix(".ran").exists()


@pytest.mark.parametrize(
    "config, named",
    [
        ({"nproc_per_node": "two"}, ["nproc_per_node must be an integer (got 'two')"]),
        ({"hosts": 5}, ["hosts must be a list of strings (got 5)"]),
        ({"policy": [1]}, ["policy must be a table (got [1])"]),
        (
            {"script": ["a"], "master_port": 1.5, "env": [["A", "b"]], "term_timeout_s": "1"},
            [
                "script must be a string",
                "master_port must be an integer or null (got 1.5)",
                "env must be a list of names",
                "term_timeout_s must be a number (got '1')",
            ],
        ),
        ({"forward_signals": [3], "warm_start": 1}, ["forward_signals must be a list of str"]),
    ],
)
def test_a_malformed_config_is_one_line_not_an_internal_error(
    tmp_path: Path, test_id: str, no_survivors: None, config: dict[str, Any], named: list[str]
):
    run_dir = tmp_path / "runs"
    script = planted_script(tmp_path)
    dead_job(run_dir / "job1", script, config)
    done = resume(run_dir, test_id)
    refused(done, "config.json does not hold a launch's settings: ", *named)
    if "warm_start" in config:
        assert "warm_start must be true or false (got 1)" in done.stderr
    assert not script.with_suffix(".ran").exists()


def test_config_json_that_is_not_an_object_is_refused(
    tmp_path: Path, test_id: str, no_survivors: None
):
    run_dir = tmp_path / "runs"
    dead_job(run_dir / "job1", planted_script(tmp_path))
    for body in ("[]", "{", "\xff"):
        (run_dir / "job1" / "config.json").write_bytes(body.encode("latin-1"))
        refused(resume(run_dir, test_id), "config.json")


def test_the_same_job_made_by_us_resumes_and_runs_its_script(
    tmp_path: Path, test_id: str, no_survivors: None
):
    """The control for the tests above: their job, ours and private, is resumed, and its script
    runs (so a refusal above is what kept the planted script from running)."""
    run_dir = tmp_path / "runs"
    script = planted_script(tmp_path)
    dead_job(run_dir / "job1", script, {"warm_start": False, "controller_grace_s": 0.0})
    done = resume(run_dir, test_id)
    assert done.returncode == 0, done.stdout + done.stderr
    assert script.with_suffix(".ran").read_text() == "ran"
