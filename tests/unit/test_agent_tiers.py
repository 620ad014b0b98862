"""Sweeping memory tiers whose agent and ranks are gone (ftrun/agent/tiers.py), with real
processes: an agent SIGKILLed (its mark names a dead process), a pid reused since, a rank that
outlived its agent and still maps the tier, a tier no agent made, the agent's own job's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from ftrun.agent import tiers


def started(*cmd: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(cmd or ["sleep", "30"], start_new_session=True)
    return proc, int(psutil.Process(proc.pid).create_time() * 1000)


def a_tier(parent: Path, name: str, *marks: tuple[int, int]) -> Path:
    tier = parent / name
    (tier / "rank0").mkdir(parents=True, mode=0o700)
    (tier / "rank0" / "slot0.data").write_bytes(b"\0" * 8192)
    for pid, start in marks:
        (tier / f"{tiers.MARK_PREFIX}{pid}-{start}").touch()
    return tier


@pytest.fixture
def procs():
    made: list[subprocess.Popen] = []
    yield made
    for proc in made:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def test_a_tier_is_swept_only_when_its_agents_and_ranks_are_gone(tmp_path, procs):
    parent = tmp_path / f"ftrun-{os.geteuid()}"
    parent.mkdir(mode=0o700)
    dead, dead_start = started()
    dead.kill()
    dead.wait(timeout=10)
    live, live_start = started()
    procs.append(live)
    orphan = a_tier(parent, "killed-agent", (dead.pid, dead_start))
    reused = a_tier(parent, "pid-reused", (live.pid, live_start - 60_000))
    running = a_tier(parent, "running", (dead.pid, dead_start), (live.pid, live_start))
    unmarked = a_tier(parent, "plain-torchrun")
    own = a_tier(parent, "own-job", (dead.pid, dead_start))
    zombie_rank = a_tier(parent, "rank-outlived-agent", (dead.pid, dead_start))
    mapper = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import mmap,sys,time; f=open(sys.argv[1],'r+b'); m=mmap.mmap(f.fileno(),0); "
            "print('mapped',flush=True); time.sleep(30)",
            str(zombie_rank / "rank0" / "slot0.data"),
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    procs.append(mapper)
    assert mapper.stdout is not None and mapper.stdout.readline() == "mapped\n"
    removed = tiers.sweep(parent, keep=own)
    assert sorted(removed) == sorted([orphan, reused])
    assert not orphan.exists() and not reused.exists()
    for kept in (running, unmarked, own, zombie_rank):
        assert (kept / "rank0" / "slot0.data").exists(), kept
    mapper.kill()
    mapper.wait(timeout=10)
    assert tiers.sweep(parent, keep=own) == [zombie_rank]  # its rank is gone too now


def test_the_agent_marks_its_own_tier_in_a_private_parent(tmp_path):
    tier = tmp_path / f"ftrun-{os.geteuid()}" / "job"
    mark = tiers.mark(tier)
    assert mark is not None and mark.parent == tier
    assert tiers._alive(mark.name)  # this process
    for path in (tier, tier.parent):
        assert os.lstat(path).st_mode & 0o777 == 0o700


def test_a_parent_that_is_not_ours_is_not_swept(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("planting as another user needs root")
    parent = tmp_path / "ftrun-other"
    parent.mkdir()
    orphan = a_tier(parent, "x", (1, 0))  # pid 1, another start time: its agent is gone
    os.chown(parent, 65534, 65534)
    assert tiers.sweep(parent) == [] and orphan.exists()
