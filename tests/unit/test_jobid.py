"""One job-id rule for the CLI and the memory tier (ftrun/jobid.py; issue 35: the two copies
disagreed, and a script named `_train.py` got an id every rank's Manager refused)."""

from __future__ import annotations

import pytest

from ftrun import jobid
from ftrun.checkpoint.config import memory_tier_dir
from ftrun.checkpoint.errors import CheckpointDirError
from ftrun.config import new_job_id


@pytest.mark.parametrize(
    "script", ["_train.py", "train.py", "my model (v2).py", "-x.py", ".hidden"]
)
def test_every_id_the_cli_makes_is_one_the_memory_tier_takes(script, tmp_path):
    job = new_job_id(script)
    assert jobid.valid(job)
    assert memory_tier_dir(job, tmp_path).name == job


@pytest.mark.parametrize(
    "bad", ["", "-rf", ".", "..", "a/b", "job\n", "job\x00", "x" * 101, "über", "a b"]
)
def test_what_is_not_a_job_id_is_refused_by_both(bad, tmp_path):
    assert not jobid.valid(bad)
    with pytest.raises(CheckpointDirError):
        memory_tier_dir(bad, tmp_path)
