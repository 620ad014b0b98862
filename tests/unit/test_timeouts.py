"""The control plane's timeouts: defaults hold together, every broken rule is named, and the
policy file's [timeouts] and the flags reach LaunchConfig."""

from __future__ import annotations

from pathlib import Path

import pytest

from ftrun.config import LaunchConfig
from ftrun.controller.policy_file import load_policy
from ftrun.errors import UsageError
from ftrun.timeouts import ControlTimeouts


def test_defaults_are_consistent():
    assert ControlTimeouts().problems() == []


@pytest.mark.parametrize(
    "values, needles",
    [
        ({"heartbeat_interval_s": 0}, ["--heartbeat-interval must be more than 0"]),
        ({"heartbeat_interval_s": -1}, ["--heartbeat-interval must be a number of seconds"]),
        ({"host_lost_timeout_s": "1"}, ["--host-lost-timeout must be a number"]),
        ({"host_lost_timeout_s": 0.4}, ["--host-lost-timeout (0.4 s) must be at least twice"]),
        ({"fence_timeout_s": 1.2}, ["--fence-timeout (1.2 s) must be at least", "(1.25 s)"]),
        ({"local_stall_timeout_s": 0.5}, ["--local-stall-timeout (0.5 s) must be 0"]),
        (
            {"heartbeat_interval_s": 0.5, "host_lost_timeout_s": 0.8, "fence_timeout_s": 1.0},
            ["twice", "--fence-timeout (1 s)"],
        ),
    ],
)
def test_each_broken_rule_is_named(values, needles):
    problems = "; ".join(ControlTimeouts(**values).problems())
    for needle in needles:
        assert needle in problems


@pytest.mark.parametrize(
    "values",
    [
        {"local_stall_timeout_s": 0},  # never
        {"heartbeat_interval_s": 1, "host_lost_timeout_s": 5, "fence_timeout_s": 10},
        {"heartbeat_interval_s": 0.1, "host_lost_timeout_s": 0.2, "fence_timeout_s": 0.3},
    ],
)
def test_consistent_values_pass(values):
    assert ControlTimeouts(**values).problems() == []


def test_launch_config_reports_all_problems_in_one_error(tmp_path: Path):
    with pytest.raises(UsageError) as e:
        LaunchConfig(
            job_id="j",
            job_name="j",
            run_dir=tmp_path,
            script="x.py",
            nproc_per_node=0,
            host_lost_timeout_s=5.0,
            fence_timeout_s=3.0,
        )
    assert "--nproc-per-node" in e.value.message and "--fence-timeout (3 s)" in e.value.message
    cfg = LaunchConfig(
        job_id="j",
        job_name="j",
        run_dir=tmp_path,
        script="x.py",
        host_lost_timeout_s=2.0,
        fence_timeout_s=5.0,
    )
    assert cfg.timeouts == ControlTimeouts(host_lost_timeout_s=2.0, fence_timeout_s=5.0)


def test_policy_file_timeouts(tmp_path: Path):
    path = tmp_path / "p.toml"
    path.write_text("[timeouts]\nhost_lost_timeout_s = 2\nfence_timeout_s = 6.5\n")
    assert load_policy(path).timeouts == {"host_lost_timeout_s": 2.0, "fence_timeout_s": 6.5}
    path.write_text("[timeouts]\nfence = 2\nheartbeat_interval_s = -1\n")
    with pytest.raises(UsageError) as e:
        load_policy(path)
    assert "unknown key(s) ['fence']" in e.value.message
    assert "[timeouts].heartbeat_interval_s: expected a non-negative number" in e.value.message
