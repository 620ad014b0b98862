"""What glibc reads in a rank: the agent lowers the non-temporal copy threshold for the ranks it
starts where glibc's own is high (ftrun/agent/copy_tunables.py), in the environment the rank's
process image started with, warm or cold, and a value the user sets wins."""

from __future__ import annotations

import os

import pytest

from ftrun.agent import copy_tunables
from tests.integration.test_contract import CONTRACT, contract_lines


@pytest.mark.parametrize("start", ["--warm-start", "--cold-start"])
def test_ranks_start_with_the_lowered_threshold_where_glibc_picks_a_higher_one(ftrun, start):
    want = copy_tunables.tunables_for_ranks(
        os.environ.get("GLIBC_TUNABLES"), copy_tunables.glibc_threshold()
    )
    result = ftrun.run(
        "launch", start, "--nproc-per-node", "2", CONTRACT, "--exec-names", "GLIBC_TUNABLES", "RANK"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    seen = contract_lines(result.stdout)
    assert len(seen) == 2
    for env in seen:
        assert env["exec"]["GLIBC_TUNABLES"] == want, env
        # A warm rank is a fork of the zygote: the tunable reached glibc through the zygote's
        # start; /proc/PID/environ then shows the rank's own environment (agent/proctitle.py).
        assert env["exec"]["RANK"] is not None, env


def test_a_threshold_the_user_sets_reaches_glibc_in_every_rank(ftrun):
    mine = f"{copy_tunables.TUNABLE}=0x200000"
    result = ftrun.run(
        "launch",
        "--warm-start",
        "--nproc-per-node",
        "2",
        "--env",
        f"GLIBC_TUNABLES={mine}",
        CONTRACT,
        "--exec-names",
        "GLIBC_TUNABLES",
        "RANK",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    seen = contract_lines(result.stdout)
    assert len(seen) == 2
    for env in seen:
        assert env["exec"]["GLIBC_TUNABLES"] == mine, env
