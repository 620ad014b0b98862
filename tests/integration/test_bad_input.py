"""Bad input gets one clear message with a hint and exit code 2, never a traceback."""

from __future__ import annotations

import signal
import socket

import pytest

from ftrun.agent.procs import job_processes
from tests.conftest import BIN, wait_for

TOY = str(BIN / "train_toy.py")


def assert_clean_usage_error(result, *needles):
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    assert "error:" in result.stderr and "hint:" in result.stderr
    for needle in needles:
        assert needle in result.stderr


def test_missing_script(ftrun):
    assert_clean_usage_error(ftrun.run("launch", "no/such/train.py"), "no such script")


def test_zero_ranks(ftrun):
    assert_clean_usage_error(
        ftrun.run("launch", "--nproc-per-node", "0", TOY), "--nproc-per-node must be at least 1"
    )


def test_all_problems_reported_at_once(ftrun):
    assert_clean_usage_error(
        ftrun.run("launch", "--nproc-per-node", "0", "nope.py"),
        "--nproc-per-node",
        "no such script",
    )


def test_run_dir_inside_a_file(ftrun, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert_clean_usage_error(
        ftrun.run("launch", "--run-dir", str(blocker / "runs"), TOY),
        f"the run directory {blocker / 'runs'} is inside {blocker}, which is a file, not a "
        "directory",
    )


def test_master_port_in_use(ftrun):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert_clean_usage_error(ftrun.run("launch", "--master-port", str(port), TOY), "in use")


@pytest.mark.parametrize("command", ["status", "inspect"])
def test_unknown_job(ftrun, command):
    assert_clean_usage_error(ftrun.run(command, "no-such-job"), "no job 'no-such-job'")


def test_unknown_launcher_option_is_an_error(ftrun):
    result = ftrun.run("launch", "--rdzv-backnd", "c10d", TOY)
    assert result.returncode == 2
    assert "No such option" in result.stderr and "Traceback" not in result.stderr
    assert not ftrun.run_dir.exists() or not any(ftrun.run_dir.iterdir())


def test_inconsistent_timeouts_name_the_flags_and_the_docs(ftrun, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text("[timeouts]\nhost_lost_timeout_s = 4\n")
    # The file sets the lost timeout, the flag the fence timeout: both count, and clash.
    result = ftrun.run("launch", "--policy", str(policy), "--fence-timeout", "2", TOY)
    assert_clean_usage_error(result, "--fence-timeout (2 s) must be at least", "docs/timeouts.md")


def test_exit_and_idle_timeouts_from_flags_or_environment(ftrun):
    """Explicit flag beats FTRUN_EXIT_TIMEOUT / FTRUN_IDLE_TIMEOUT beats the default."""
    bad_env = {"FTRUN_EXIT_TIMEOUT": "0", "FTRUN_IDLE_TIMEOUT": "-1"}
    assert_clean_usage_error(
        ftrun.run("launch", "nope.py", env=bad_env),
        "--exit-timeout must be more than 0",
        "--idle-timeout must be 0 (off) or more",
        "no such script",
    )
    result = ftrun.run(
        "launch", "--exit-timeout", "5", "--idle-timeout", "0", "nope.py", env=bad_env
    )
    assert_clean_usage_error(result, "no such script")
    assert "timeout" not in result.stderr


def test_bad_planning_input_is_one_message_before_anything_starts(ftrun, tmp_path):
    corrupt = tmp_path / "profile.json"
    corrupt.write_text('{"version": 1, "layers": [{"name": "a", "fwd_s": "fast"}]}')
    result = ftrun.run("launch", "--profile", str(corrupt), "--device-memory", "lots", TOY)
    assert_clean_usage_error(result, "--profile", "--device-memory", "ftrun profile")
    assert not list((ftrun.run_dir).glob("*/events.jsonl"))  # no job was started
    missing = ftrun.run("launch", "--profile", str(tmp_path / "none.json"), TOY)
    assert_clean_usage_error(missing, "cannot be read")
    assert_clean_usage_error(
        ftrun.run("launch", "--global-batch", "64", TOY), "--global-batch", "need --profile"
    )


def test_a_job_id_in_use_on_this_machine_under_another_run_dir_is_refused(ftrun, tmp_path):
    """Two jobs of one id would have agents of one process tag (each one's sweep SIGKILLs the
    other's ranks) and one memory tier: the second is refused before it starts anything."""
    job = f"dup-{tmp_path.name[-12:]}".replace("_", "-")
    first = ftrun.start("launch", "--job-id", job, str(BIN / "sleeper.py"))
    try:
        wait_for(lambda: job_processes(job), 60, "the first job's agent")
        other = tmp_path / "other-runs"
        second = ftrun.run("launch", "--run-dir", str(other), "--job-id", job, TOY)
        assert_clean_usage_error(second, f"job id {job} is in use on this machine", "--job-id")
        assert not (other / job).exists()  # nothing started, nothing written
        assert first.poll() is None  # and the first job runs on
    finally:
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=60) == 130


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--hang-floor", "nan"),  # turned hang detection off
        ("--host-lost-timeout", "nan"),
        ("--fence-timeout", "nan"),
        ("--term-timeout", "inf"),  # waited for ever
        ("--controller-grace", "nan"),
        ("--idle-timeout", "nan"),
        ("--peer-copy-rate", "nan"),
        ("--replan-horizon", "inf"),
    ],
)
def test_numbers_that_are_not_numbers_are_refused(ftrun, flag, value):
    """NaN passes every bound (`nan < 0` is false): each flag says so itself (issue 34)."""
    assert_clean_usage_error(
        ftrun.run("launch", flag, value, TOY), f"{flag} must be a finite number (got {value})"
    )
