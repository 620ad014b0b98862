"""Where an agent keeps its sockets and per-generation files on its host, and making sure none
outlives its agent.

The directory is in the system temp dir (unix socket paths must stay short) and carries the
agent's pid in its name: an agent that was SIGKILLed (a lost host coming back, a test that kills
agents) cannot remove its own, so every new agent removes those whose agent is gone.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import psutil

PREFIX = "ftrun-agent-"
SHM = Path("/dev/shm")


def create() -> Path:
    sweep_stale(Path(tempfile.gettempdir()))
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))


def sweep_stale(parent: Path) -> list[Path]:
    """Remove agent directories whose agent process no longer exists."""
    removed = []
    for path in parent.glob(f"{PREFIX}*"):
        pid = path.name[len(PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def memory_tier(job_id: str) -> Path:
    """The job's host-memory checkpoint tier (ftrun.checkpoint.memory_tier_dir): the agent owns
    it and removes it when the job ends. Kept in step with ftrun/checkpoint/config.py."""
    return SHM / f"ftrun-{job_id}"
