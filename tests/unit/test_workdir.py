"""Agent work dirs carry their agent's pid, so a dead agent's dir is swept by the next agent."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

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


def test_another_users_directory_or_a_link_is_never_removed(tmp_path):
    """/tmp and /dev/shm are shared: a name like ours owned by someone else, or a link planted
    under that name, stays (root would otherwise delete any user's files)."""
    if os.geteuid() != 0:
        pytest.skip("making another user's directory needs root")
    victim = tmp_path / "victim"
    (victim / "keep").mkdir(parents=True)
    link = tmp_path / f"{workdir.PREFIX}999999999-link"
    link.symlink_to(victim)
    foreign = tmp_path / f"{workdir.PREFIX}999999998-foreign"
    (foreign / "theirs").mkdir(parents=True)
    os.chown(foreign, 65534, 65534)
    mine = tmp_path / f"{workdir.PREFIX}999999997-mine"
    mine.mkdir()
    removed = workdir.sweep_stale(tmp_path)
    assert removed == [mine]
    assert (victim / "keep").exists() and link.is_symlink()
    assert (foreign / "theirs").exists()
    assert not workdir.remove_if_ours(link) and (victim / "keep").exists()
