"""The torchrun contract under ftrun: what a rank sees in its environment, in every generation,
and what reaches it from the launcher (variables, signals), with real ranks."""

from __future__ import annotations

import json

import pytest

from tests.conftest import BIN

CONTRACT = str(BIN / "contract.py")


def contract_lines(stdout: str) -> list[dict[str, str | None]]:
    return [json.loads(line.split("CONTRACT ", 1)[1]) for line in stdout.splitlines()
            if "CONTRACT " in line]


@pytest.mark.parametrize("start", ["--warm-start", "--cold-start"])
def test_torchelastic_variables_as_torchrun_defines_them_in_every_generation(ftrun, tmp_path,
                                                                            start):
    result = ftrun.run("launch", start, "--nproc-per-node", "2", "--max-restarts", "4",
                       CONTRACT, "--fail-once", str(tmp_path / "failed-once"))
    assert result.returncode == 0, result.stdout + result.stderr
    job = ftrun.only_job()
    assert (job["generation"], job["restarts"]) == (2, 1)
    seen = contract_lines(result.stdout)
    assert sorted((e["FTRUN_GENERATION"], e["RANK"]) for e in seen) == [
        ("1", "0"), ("1", "1"), ("2", "0"), ("2", "1")]
    error_files = set()
    for env in seen:
        restarts_so_far = str(int(env["FTRUN_GENERATION"]) - 1)
        assert env["TORCHELASTIC_RESTART_COUNT"] == restarts_so_far, env
        assert env["TORCHELASTIC_MAX_RESTARTS"] == "4", env
        assert env["TORCHELASTIC_RUN_ID"] == job["job_id"] == env["FTRUN_JOB_ID"], env
        assert env["GROUP_RANK"] == "0" and env["ROLE_RANK"] == env["RANK"], env
        assert env["LOCAL_RANK"] == env["RANK"] and env["LOCAL_WORLD_SIZE"] == "2", env
        assert env["TORCHELASTIC_ERROR_FILE"].endswith(f"/{env['LOCAL_RANK']}/error.json"), env
        error_files.add(env["TORCHELASTIC_ERROR_FILE"])
    assert len(error_files) == 4, "each rank of each generation has its own error file"


def test_record_error_file_is_the_root_cause(ftrun):
    result = ftrun.run("launch", "--max-restarts", "0", str(BIN / "record_error.py"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout  # the rank printed none: only its error file has it
    assert "died with exit code 1: DatasetCorrupt: shard 17 has a bad header" in result.stderr
    assert "raise DatasetCorrupt" in result.stderr
    job_id = ftrun.only_job()["job_id"]
    inspected = json.loads(ftrun.run("inspect", job_id, "--json").stdout)
    root = inspected["root_cause"]
    assert root["exception"] == "DatasetCorrupt: shard 17 has a bad header"
    assert root["traceback_source"] == "error file"
    assert "in open_shard" in root["traceback"] and "record_error.py" in root["traceback"]
    [incident] = inspected["incidents"]
    assert incident["exception"] == root["exception"]
    assert incident["traceback"] == root["traceback"]
    assert "DatasetCorrupt: shard 17" in ftrun.run("inspect", job_id).stdout
