"""Terms on a host (ftrun/terms.py): the highest controller term a host obeyed, and what an
older controller is refused there: its sweep kills nothing (agent/procs.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ftrun import terms
from ftrun.errors import EXIT_SUPERSEDED


def test_a_host_keeps_the_highest_term_and_refuses_older_ones(tmp_path: Path) -> None:
    assert terms.current("job-a1", tmp_path) == 0
    assert terms.obey("job-a1", 1, tmp_path)
    assert not terms.superseded("job-a1", 1, tmp_path)
    assert not list(tmp_path.rglob("*.term")), "a job at term 1 leaves no file"
    assert terms.obey("job-a1", 2, tmp_path)  # a standby took over
    assert terms.current("job-a1", tmp_path) == 2
    assert terms.superseded("job-a1", 1, tmp_path)
    assert not terms.obey("job-a1", 1, tmp_path)  # the cut-off primary, back
    assert terms.current("job-a1", tmp_path) == 2
    assert terms.current("job-b2", tmp_path) == 0  # per job
    terms.forget("job-a1", tmp_path)
    assert terms.current("job-a1", tmp_path) == 0
    assert not list(tmp_path.rglob("*.term")), "forget leaves nothing"


def test_a_sweep_of_an_older_term_kills_nothing(tmp_path: Path) -> None:
    job = f"sweeptest-{tmp_path.name[-6:].replace('_', '')}"
    tag = f"{job}/node9#1"
    env = {"FTRUN_AGENT_ID": tag}
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        terms.obey(job, 2)
        swept = subprocess.run(
            [sys.executable, "-m", "ftrun.agent.procs", tag, "1"], capture_output=True, text=True
        )
        assert swept.returncode == EXIT_SUPERSEDED, swept.stderr
        assert "newer than term 1" in swept.stderr
        assert victim.poll() is None, "an older term's sweep killed the process"
        swept = subprocess.run([sys.executable, "-m", "ftrun.agent.procs", tag, "2"])
        assert swept.returncode == 0
        assert victim.wait(timeout=10) != 0, "the current term's sweep kills it"
    finally:
        terms.forget(job)
        if victim.poll() is None:
            victim.kill()
            victim.wait(timeout=10)
