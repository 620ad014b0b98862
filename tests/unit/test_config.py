from __future__ import annotations

from pathlib import Path

import pytest

from ftrun.config import LaunchConfig, resolve_run_dir
from ftrun.errors import UsageError


def make(**kw):
    base = dict(job_id="j", job_name="j", run_dir=Path("/tmp/r"), script="t.py")
    return LaunchConfig(**{**base, **kw})


def test_run_dir_precedence():
    assert resolve_run_dir("/x", {"FTRUN_RUN_DIR": "/y"}) == Path("/x")
    assert resolve_run_dir(None, {"FTRUN_RUN_DIR": "/y"}) == Path("/y")
    assert resolve_run_dir(None, {}) == Path("~/.ftrun/runs").expanduser()


def test_validation_reports_every_problem_at_once():
    with pytest.raises(UsageError) as e:
        make(nproc_per_node=0, max_restarts=-1, progress_regex="no group")
    for needle in ("--nproc-per-node", "--max-restarts", "--progress-regex"):
        assert needle in e.value.message
    assert e.value.exit_code == 2


def test_entrypoint_matches_torchrun():
    assert make(script_args=("--lr", "1")).entrypoint()[1:] == ["-u", "t.py", "--lr", "1"]
    assert make(module=True, script="pkg.m").entrypoint()[1:] == ["-u", "-m", "pkg.m"]
    assert make(no_python=True, script="./run.sh").entrypoint() == ["./run.sh"]


def test_forward_signals_are_names_of_signals_that_can_be_passed_on():
    from ftrun.config import signal_name

    assert [signal_name(s) for s in ("usr1", "SIGUSR2", " hup ")] == [
        "SIGUSR1",
        "SIGUSR2",
        "SIGHUP",
    ]
    assert make(forward_signals=("SIGUSR1", "SIGUSR2")).forward_signals == ("SIGUSR1", "SIGUSR2")
    with pytest.raises(UsageError) as e:
        make(forward_signals=("SIGTERM", "SIGKILL", "SIGNOPE"))
    assert "cannot take SIGTERM: it stops the job" in e.value.message
    assert "cannot take SIGKILL" in e.value.message and "no signal 'SIGNOPE'" in e.value.message


@pytest.mark.parametrize(
    "exit_s, idle_s, problems",
    [
        (60.0, 1800.0, []),
        (0.5, 0.0, []),
        (0.0, 1800.0, ["--exit-timeout"]),
        (60.0, -1.0, ["--idle-timeout"]),
    ],
)
def test_exit_and_idle_timeouts(exit_s, idle_s, problems):
    if not problems:
        config = make(exit_timeout_s=exit_s, idle_timeout_s=idle_s)
        assert (config.exit_timeout_s, config.idle_timeout_s) == (exit_s, idle_s)
        return
    with pytest.raises(UsageError) as e:
        make(exit_timeout_s=exit_s, idle_timeout_s=idle_s)
    assert all(p in e.value.message for p in problems)


def test_exit_and_idle_defaults():
    config = make()
    assert (config.exit_timeout_s, config.idle_timeout_s) == (60.0, 1800.0)


def test_max_nodes_is_at_least_min_nodes():
    assert make(hosts=("a",), transport="ssh", max_nodes=8).max_nodes == 8
    with pytest.raises(UsageError, match="--max-nodes must be at least --min-nodes"):
        make(hosts=("a", "b"), transport="ssh", min_nodes=2, max_nodes=1)


def test_the_standby_is_one_of_the_jobs_other_machines():
    assert make(hosts=("a", "b"), spares=("c",), transport="ssh", standby="c").standby == "c"
    assert make(hosts=("a", "b"), transport="ssh", standby="b").standby == "b"
    with pytest.raises(UsageError, match="--standby d is not one of the job's --hosts or --spares"):
        make(hosts=("a", "b"), transport="ssh", standby="d")
    with pytest.raises(UsageError, match="--standby needs hosts on other machines"):
        make(standby="localhost")
