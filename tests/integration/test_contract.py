"""The torchrun contract under ftrun: what a rank sees in its environment, in every generation,
and what reaches it from the launcher (variables, signals), with real ranks."""

from __future__ import annotations

import json
import signal
import time

import psutil
import pytest

from tests.conftest import BIN, Output, tagged

CONTRACT = str(BIN / "contract.py")
SIGNALS = str(BIN / "signals.py")


def contract_lines(stdout: str) -> list[dict[str, str | None]]:
    return [
        json.loads(line.split("CONTRACT ", 1)[1])
        for line in stdout.splitlines()
        if "CONTRACT " in line
    ]


@pytest.mark.parametrize("start", ["--warm-start", "--cold-start"])
def test_torchelastic_variables_as_torchrun_defines_them_in_every_generation(
    ftrun, tmp_path, start
):
    result = ftrun.run(
        "launch",
        start,
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "4",
        CONTRACT,
        "--fail-once",
        str(tmp_path / "failed-once"),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    job = ftrun.only_job()
    assert (job["generation"], job["restarts"]) == (2, 1)
    seen = contract_lines(result.stdout)
    assert sorted((e["FTRUN_GENERATION"], e["RANK"]) for e in seen) == [
        ("1", "0"),
        ("1", "1"),
        ("2", "0"),
        ("2", "1"),
    ]
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
    job_id = ftrun.job_id()
    inspected = json.loads(ftrun.run("inspect", job_id, "--json").stdout)
    root = inspected["root_cause"]
    assert root["exception"] == "DatasetCorrupt: shard 17 has a bad header"
    assert root["traceback_source"] == "error file"
    assert "in open_shard" in root["traceback"] and "record_error.py" in root["traceback"]
    [incident] = inspected["incidents"]
    assert incident["exception"] == root["exception"]
    assert incident["traceback"] == root["traceback"]
    assert "DatasetCorrupt: shard 17" in ftrun.run("inspect", job_id).stdout


def test_sigterm_reaches_every_rank_and_its_handler_gets_the_term_timeout(ftrun, tmp_path):
    proc = ftrun.start(
        "launch",
        "--nproc-per-node",
        "2",
        "--term-timeout",
        "30",
        SIGNALS,
        "--dir",
        str(tmp_path),
        "--save-s",
        "1.5",
    )
    out = Output(proc)
    out.wait_for("[rank1]: step 3")
    out.wait_for("[rank0]: step 3")
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=40) == 130, out.text()
    took = time.monotonic() - started
    for rank in (0, 1):  # each rank saved: 1.5 s of work, within the term timeout, not killed
        assert (tmp_path / f"saved-rank{rank}").exists(), out.text()
        assert f"[rank{rank}]: saved at step" in out.text()
    assert 1.5 <= took < 25, f"the stop took {took:.1f} s: it should end when the ranks do"
    job = ftrun.only_job()
    assert job["state"] == "stopped" and job["incidents"] == []


def test_term_timeout_bounds_a_rank_that_ignores_sigterm(ftrun, tmp_path):
    proc = ftrun.start(
        "launch",
        "--term-timeout",
        "1",
        str(BIN / "sleeper.py"),
        "--ignore-sigterm",
        "--pid-dir",
        str(tmp_path),
    )
    out = Output(proc)
    out.wait_for("[rank0]: step 3")
    [pid] = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 130, out.text()
    took = time.monotonic() - started
    assert 1.0 <= took < 8, f"SIGKILL came {took:.1f} s after SIGTERM with --term-timeout 1"
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_forward_signal_reaches_each_rank_handler_and_the_job_goes_on(ftrun, tmp_path):
    proc = ftrun.start(
        "launch",
        "--nproc-per-node",
        "2",
        "--forward-signal",
        "usr1",
        SIGNALS,
        "--dir",
        str(tmp_path),
        "--after-usr1",
        "10",
    )
    out = Output(proc)
    out.wait_for("[rank1]: step 3")
    out.wait_for("[rank0]: step 3")
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=60) == 0, out.text()  # the launcher neither died nor stopped
    for rank in (0, 1):
        assert (tmp_path / f"usr1-rank{rank}").exists(), out.text()
        assert f"[rank{rank}]: got SIGUSR1 at step" in out.text()
    job = ftrun.only_job()
    assert (job["state"], job["generation"], job["incidents"]) == ("succeeded", 1, [])
    events = ftrun.events(job["job_id"])
    assert [(e["signal"], e["gen"]) for e in events if e["kind"] == "signal_forwarded"] == [
        ("SIGUSR1", 1)
    ]
    [delivered] = [e for e in events if e["kind"] == "signal_delivered"]
    assert delivered["ranks"] == [0, 1] and delivered["host"] == "localhost"


def test_env_and_env_file_reach_every_rank_and_no_command_line(ftrun, tmp_path, test_id):
    secret = "sk-" + test_id  # unique: found on a command line only if we leaked it
    env_file = tmp_path / "job.env"
    env_file.write_text(
        f"# for the job\nexport DATA_DIR='/data/odd path'\nWANDB_API_KEY={secret}\nFROM_FILE=file\n"
    )
    proceed = tmp_path / "proceed"
    ftrun.env["FROM_LAUNCHER"] = "here"
    proc = ftrun.start(
        "launch",
        "--nproc-per-node",
        "2",
        "--env-file",
        str(env_file),
        "--env",
        "FROM_FILE=flag",
        "--env",
        "FROM_LAUNCHER",
        CONTRACT,
        "--wait-for",
        str(proceed),
        "--names",
        "DATA_DIR",
        "WANDB_API_KEY",
        "FROM_FILE",
        "FROM_LAUNCHER",
    )
    out = Output(proc)
    out.wait_for("[rank1]: CONTRACT")
    out.wait_for("[rank0]: CONTRACT")
    try:
        leaks = [p.pid for p in tagged(test_id) if secret in " ".join(_cmdline(p))]
    finally:
        proceed.touch()
    assert proc.wait(timeout=60) == 0, out.text()
    assert leaks == [], "a secret from --env-file is on a command line"
    seen = contract_lines(out.text())
    assert len(seen) == 2
    for env in seen:
        assert env["DATA_DIR"] == "/data/odd path" and env["WANDB_API_KEY"] == secret
        assert env["FROM_FILE"] == "flag" and env["FROM_LAUNCHER"] == "here"
    job_dir = ftrun.run_dir / ftrun.job_id()
    config = json.loads((job_dir / "config.json").read_text())
    assert config["env"] == ["DATA_DIR", "WANDB_API_KEY", "FROM_FILE", "FROM_LAUNCHER"]
    # Only where the script itself printed it: its own logs, none of ftrun's files.
    holders = sorted(
        p.name
        for p in job_dir.rglob("*")
        if p.is_file() and secret in p.read_text("utf-8", "replace")
    )
    assert holders == ["rank0.log", "rank1.log"]


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def test_bad_env_input_is_one_clear_error(ftrun, tmp_path):
    env_file = tmp_path / "bad.env"
    env_file.write_text("OK=1\njust words\nRANK=3\n")
    result = ftrun.run(
        "launch",
        "--env-file",
        str(env_file),
        "--env",
        "MISSING_HERE",
        "--forward-signal",
        "TERM",
        CONTRACT,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("error:") == 1
    for needle in (
        f"{env_file}, line 2: not NAME=VALUE",
        "line 3: RANK is set for each rank",
        "--env MISSING_HERE: MISSING_HERE is not set here",
        "--forward-signal cannot take SIGTERM",
        "hint:",
    ):
        assert needle in result.stderr, result.stderr
