"""The job's checkpoint key (ftrun/controller/jobkey.py): made once in the job directory and the
same after a controller restart or a requeue; the launcher's own key wins; it reaches each rank in
its environment from the agent's bootstrap, never in argv."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict
from pathlib import Path

import pytest

from ftrun import envcontract
from ftrun.agent.torchrun_cmd import torchrun_command
from ftrun.bootstrap import Bootstrap
from ftrun.controller.jobkey import KEY_FILE, job_checkpoint_key
from ftrun.errors import UsageError
from ftrun.jobfiles import JobDir
from tests.hostile.planted import OTHER_UID

LAUNCH = {
    "gen": 1,
    "nnodes": 1,
    "node_rank": 0,
    "nproc_per_node": 1,
    "master_addr": "127.0.0.1",
    "master_port": 1,
    "entrypoint": ["train.py"],
}


def key_of(job_dir: Path, env: dict[str, str]) -> str:
    """The key as the controller gets it: through the job directory, checked and held open."""
    with JobDir.open(job_dir, exist_ok=True) as files:
        return job_checkpoint_key(files, env)


def test_made_once_per_job_and_the_same_after_a_restart(tmp_path):
    key = key_of(tmp_path, {})
    path = tmp_path / KEY_FILE
    assert len(bytes.fromhex(key)) == 32 and path.read_text().strip() == key
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    assert key_of(tmp_path, {}) == key  # a restarted controller, a requeued job


def test_the_launchers_own_key_wins_and_no_file_is_made(tmp_path):
    given = "ab" * 32
    assert key_of(tmp_path, {envcontract.CHECKPOINT_KEY: given}) == given
    assert not (tmp_path / KEY_FILE).exists()
    with pytest.raises(UsageError, match="FTRUN_CHECKPOINT_KEY is not a key"):
        key_of(tmp_path, {envcontract.CHECKPOINT_KEY: "no"})


@pytest.mark.parametrize("plant", ["a link", "another owner", "mode 0640", "job dir 0777"])
def test_a_key_file_someone_else_could_have_planted_is_refused(tmp_path, plant):
    path = tmp_path / KEY_FILE
    if plant == "a link":
        (tmp_path / "theirs").write_text("ab" * 32)
        path.symlink_to(tmp_path / "theirs")
    else:
        path.write_text("ab" * 32)
        os.chmod(path, 0o600)
        if plant == "another owner":
            os.chown(path, OTHER_UID, OTHER_UID)
        elif plant == "mode 0640":
            os.chmod(path, 0o640)
        else:
            os.chmod(tmp_path, 0o777)
    with pytest.raises(UsageError, match="is not safe to use") as err:
        key_of(tmp_path, {})
    if plant == "job dir 0777":  # refused before the key is even looked at
        assert f"the job directory {tmp_path} is not safe" in err.value.message
    else:
        assert "remove checkpoint.key" in err.value.hint


def test_the_key_reaches_each_rank_in_its_environment_not_its_argv(tmp_path: Path):
    key = key_of(tmp_path, {})
    boot = Bootstrap(
        controller_host="h",
        controller_port=1,
        secret="s",
        job_id="j",
        agent_id="a",
        host="h",
        heartbeat_interval_s=0.5,
        fence_timeout_s=2.0,
        warm_start=False,
        checkpoint_key=key,
    )
    again = Bootstrap.from_json(json.dumps(asdict(boot)))  # what the agent reads on stdin
    cmd = torchrun_command(
        again, LAUNCH, directory=tmp_path, agent_sock="s", zygote_sock=None, base_env={}
    )
    assert cmd.env[envcontract.CHECKPOINT_KEY] == key
    assert not any(key in arg for arg in cmd.argv)
    keyless = torchrun_command(
        Bootstrap(**{**asdict(boot), "checkpoint_key": ""}),
        LAUNCH,
        directory=tmp_path,
        agent_sock="s",
        zygote_sock=None,
        base_env={},
    )
    assert envcontract.CHECKPOINT_KEY not in keyless.env  # the rank falls back to the user's key
