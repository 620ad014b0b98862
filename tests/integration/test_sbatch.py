"""`ftrun sbatch` through the real CLI: --dry-run prints the script and writes nothing, bad input
is one message with exit 2, and a machine without Slurm's client commands gets a clear error.

A real submission is tested against a real Slurm (tests/testbed); here sbatch is never faked: the
failure test runs the real sbatch against an empty configuration, which it refuses at once.
"""

from __future__ import annotations

import shutil
import sys

import pytest

from tests.conftest import BIN
from tests.integration.test_bad_input import assert_clean_usage_error

TOY = str(BIN / "train_toy.py")


def test_dry_run_prints_the_script_and_creates_nothing(ftrun, tmp_path):
    result = ftrun.run(
        "sbatch", "--nodes", "4", "--spares", "1", "--time", "4:00:00", "--nproc-per-node", "8",
        "--dry-run", "--", TOY, "--lr", "3e-4",
        cwd=str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert "#SBATCH --nodes=5" in lines and "#SBATCH --no-kill" in lines
    assert f"#SBATCH --chdir={tmp_path}" in lines
    assert any(ln.startswith(f"#SBATCH --output={ftrun.run_dir}/train_toy-") for ln in lines)
    assert f"exec {sys.executable} -m ftrun launch \\" in lines
    assert f"    -- {TOY} --lr 3e-4" in lines
    assert "nothing written" in result.stderr
    assert list(tmp_path.iterdir()) == []  # no run dir (ftrun.run_dir is in tmp_path), no job


def test_bad_input_is_one_message(ftrun):
    result = ftrun.run(
        "sbatch", "--nodes", "0", "--spares", "-1", "--gpus-per-node", "0", "--time", "4h",
        "--signal", "USR2", "--sbatch-arg", "qos=high", "--nproc-per-node", "0",
        "--dry-run", "--", "no/such/train.py",
    )  # fmt: skip
    assert_clean_usage_error(
        result,
        "--nodes must be at least 1",
        "--spares must be 0 or more",
        "--gpus-per-node must be at least 1",
        "--time must be",
        "--signal must be [B:]NAME@SECONDS",
        "--sbatch-arg takes one sbatch option",
        "--nproc-per-node must be at least 1",
        "no such script",
        "ftrun sbatch --help",
    )
    assert result.stderr.count("error:") == 1
    assert not ftrun.run_dir.exists()


def test_notice_longer_than_the_time_limit(ftrun):
    result = ftrun.run("sbatch", "--time", "1", "--signal", "USR1@90", "--dry-run", TOY)
    assert_clean_usage_error(result, "comes 90 s before the end of a --time 1 (60 s) job")


def test_without_sbatch_nothing_is_written(ftrun, tmp_path):
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    result = ftrun.run("sbatch", TOY, env={"PATH": str(empty_bin)})
    assert_clean_usage_error(result, "sbatch not found", "--dry-run")
    assert not ftrun.run_dir.exists()


@pytest.mark.skipif(shutil.which("sbatch") is None, reason="Slurm's client commands not installed")
def test_sbatch_failure_keeps_the_job_directory(ftrun, tmp_path):
    empty_conf = tmp_path / "slurm.conf"
    empty_conf.write_text("")  # sbatch refuses it at once, and reaches no cluster
    result = ftrun.run("sbatch", TOY, env={"SLURM_CONF": str(empty_conf)})
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "sbatch failed" in result.stderr and "Traceback" not in result.stderr
    (job_dir,) = ftrun.run_dir.iterdir()
    script = job_dir / "sbatch.sh"
    assert f"the script is kept in {script}" in result.stderr.replace("\n", "")
    assert script.read_text().startswith("#!/bin/bash\n")
    assert f"--job-id {job_dir.name}" in script.read_text()


def test_help_shows_the_shared_launch_options(ftrun):
    out = ftrun.run("sbatch", "--help").stdout
    for flag in ("--nodes", "--spares", "--signal", "--dry-run", "--nproc-per-node", "--policy"):
        assert flag in out


def test_json_and_dry_run_do_not_mix(ftrun):
    assert_clean_usage_error(ftrun.run("sbatch", "--json", "--dry-run", TOY), "give one")


def test_launch_options_reach_the_step(ftrun, tmp_path):
    env_file = tmp_path / "x.env"
    env_file.write_text("A=1\n")
    result = ftrun.run(
        "sbatch", "--dry-run", "--no-requeue", "--signal", "sigusr1@300", "--env-file",
        str(env_file), "--cold-start", "--exit-timeout", "30", "--", TOY,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    step = result.stdout.split("exec ", 1)[1]
    for part in (
        "--preempt-signal SIGUSR1",
        "--preempt-grace 285",
        "--no-requeue",
        f"--env-file {env_file}",
        "--cold-start",
        "--exit-timeout 30",
    ):
        assert part in step
    assert "#SBATCH --signal=B:USR1@300" in result.stdout
    assert step.rstrip().endswith(f"-- {TOY}")


@pytest.mark.parametrize(
    ("given", "named"),
    [
        (("--job-name", "x\ntouch /tmp/ftrun-pwned"), "--job-name"),
        (("--partition", "gpu\ntouch /tmp/ftrun-pwned"), "--partition"),
        (("--run-dir", "/tmp/runs\ntouch /tmp/ftrun-pwned"), "the run directory's path"),
    ],
)
def test_a_line_break_in_what_the_batch_script_quotes_is_refused(ftrun, given, named):
    """In the #SBATCH block a newline ended the quoted line and the next one ran as a command
    (issue 34): nothing is printed or written."""
    result = ftrun.run("sbatch", *given, "--dry-run", TOY)
    assert_clean_usage_error(result, f"{named}: a line break")
    assert "#SBATCH" not in result.stdout


@pytest.mark.parametrize(
    ("given", "named"),
    [
        (("--time", "1:00:00\ntouch /tmp/ftrun-pwned"), "--time must be"),
        (("--sbatch-arg", "--qos=high\ntouch /tmp/ftrun-pwned"), "--sbatch-arg takes one"),
    ],
)
def test_a_line_break_in_a_checked_value_fails_its_own_check(ftrun, given, named):
    """--time and --sbatch-arg have a form of their own, and a line break breaks it."""
    result = ftrun.run("sbatch", *given, "--dry-run", TOY)
    assert_clean_usage_error(result, named)
    assert "#SBATCH" not in result.stdout


def test_a_line_break_in_the_current_directory_is_refused(ftrun, tmp_path):
    here = tmp_path / "runs\ntouch pwned"
    here.mkdir()
    result = ftrun.run("sbatch", "--dry-run", TOY, cwd=str(here))
    assert_clean_usage_error(result, "the current directory's path: a line break")
    assert "#SBATCH" not in result.stdout
