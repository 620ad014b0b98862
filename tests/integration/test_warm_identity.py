"""A warm rank as `ps`, `pgrep` and /proc show it: its command line reads `ftrun rank R/W` and
then the script and its arguments (a person sees which rank is which, `pgrep -f contract.py`
still finds it), and /proc/PID/environ holds the rank's own environment, RANK and the other
torchrun variables included, as a cold rank's does (ftrun/agent/proctitle.py)."""

from __future__ import annotations

import subprocess

import psutil
import pytest

from tests.conftest import Output, tagged
from tests.integration.test_contract import CONTRACT, contract_lines

TORCHRUN_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "FTRUN_JOB_ID")


def _ranks(test_id: str) -> dict[int, psutil.Process]:
    """The job's rank processes (not their shims), by RANK in /proc/PID/environ."""
    found = {}
    for p in tagged(test_id):
        try:
            cmdline, env = p.cmdline(), p.environ()
        except psutil.Error:
            continue
        if "rank_shim.py" not in " ".join(cmdline) and "RANK" in env and CONTRACT in cmdline:
            found[int(env["RANK"])] = p
    return found


@pytest.mark.parametrize("start", ["--warm-start", "--cold-start"])
def test_ranks_show_their_own_command_line_and_environment(ftrun, tmp_path, test_id, start):
    proceed = tmp_path / "proceed"
    proc = ftrun.start(
        "launch",
        start,
        "--nproc-per-node",
        "2",
        CONTRACT,
        "--wait-for",
        str(proceed),
        "--exec-names",
        *TORCHRUN_NAMES,
    )
    out = Output(proc)
    try:
        out.wait_for("[rank1]: CONTRACT")
        out.wait_for("[rank0]: CONTRACT")
        ranks = _ranks(test_id)
        titles = {r: p.cmdline() for r, p in ranks.items()}
        environs = {r: p.environ() for r, p in ranks.items()}
        pgrep = subprocess.run(["pgrep", "-f", CONTRACT], capture_output=True, text=True)
    finally:
        proceed.touch()
    assert proc.wait(timeout=60) == 0, out.text()
    assert sorted(ranks) == [0, 1], (titles, out.text())
    found_by_pgrep = {int(pid) for pid in pgrep.stdout.split()}
    for rank, p in ranks.items():
        assert p.pid in found_by_pgrep
        assert environs[rank]["WORLD_SIZE"] == "2"
        assert environs[rank]["FTRUN_AGENT_ID"]  # the agent's sweep finds it by this tag
        if start == "--warm-start":
            assert titles[rank][:4] == ["ftrun", "rank", f"{rank}/2", CONTRACT], titles
            assert titles[rank][4:] == ["--wait-for", str(proceed), "--exec-names", *TORCHRUN_NAMES]
    # What each rank read from its own /proc/self/environ is what its os.environ holds.
    seen = contract_lines(out.text())
    assert len(seen) == 2
    for env in seen:
        exec_env = env["exec"]
        assert isinstance(exec_env, dict)
        assert exec_env["RANK"] in ("0", "1") and exec_env["WORLD_SIZE"] == "2", env
        for name in ("RANK", "FTRUN_JOB_ID"):
            assert exec_env[name] == env[name], env
