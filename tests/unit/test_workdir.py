"""Agent work dirs carry their agent's pid, so a dead agent's dir is swept by the next agent."""

from __future__ import annotations

import os
import subprocess
import sys

from ftrun.agent import workdir


def test_sweep_removes_only_dirs_of_dead_agents(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_dir = tmp_path / f"{workdir.PREFIX}{dead.stdout.strip()}-x1"
    live_dir = tmp_path / f"{workdir.PREFIX}{os.getpid()}-x2"
    other = tmp_path / f"{workdir.PREFIX}legacy"
    for d in (dead_dir, live_dir, other):
        (d / "g1").mkdir(parents=True)
    assert workdir.sweep_stale(tmp_path) == [dead_dir]
    assert live_dir.exists() and other.exists() and not dead_dir.exists()
