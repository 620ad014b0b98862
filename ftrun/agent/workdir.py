"""Where an agent keeps its sockets and per-generation files on its host, and making sure none
outlives its agent.

The directory is in the system temp dir (unix socket paths must stay short) and carries the
agent's pid in its name: an agent that was SIGKILLed (a lost host coming back, a test that kills
agents) cannot remove its own, so every new agent removes those whose agent is gone.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

import psutil

from ftrun import memtier
from ftrun.claims import read_claim

log = logging.getLogger("ftrun.agent")

PREFIX = "ftrun-agent-"
SHM = memtier.ROOT


def create() -> Path:
    sweep_stale(Path(tempfile.gettempdir()))
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))


def sweep_stale(parent: Path) -> list[Path]:
    """Remove agent directories whose agent process no longer exists."""
    removed = []
    for path in parent.glob(f"{PREFIX}*"):
        pid = path.name[len(PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)) and remove_if_ours(path):
            removed.append(path)
    return removed


def remove_if_ours(path: Path) -> bool:
    """Remove a directory tree only if it is a real directory (not a link) that we own: names in
    /tmp and /dev/shm are shared with every user, and another's directory there is not ours to
    delete, even for root (docs/security.md). True if it was removed."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


def remove_memory_tier(job_id: str, *, newest_gen: int) -> bool:
    """Remove the job's memory tier on this host, unless a generation newer than `newest_gen`
    (the newest this agent ran) has claimed it (claims.py): then this agent was fenced off and
    the tier belongs to ranks elsewhere that share this /dev/shm. True if it was removed."""
    tier = memory_tier(job_id)
    claim = read_claim(tier)
    if claim is not None and claim.job == job_id and claim.generation > newest_gen:
        log.info("left %s: generation %d of the job uses it", tier, claim.generation)
        return False
    return remove_if_ours(tier)


def redirect_output(path: Path) -> None:
    """Point stdout and stderr at a file of ours: the pipe or ssh channel they were is gone,
    and a write into it would fail (EPIPE) in the middle of whatever logs."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)


def memory_tier(job_id: str) -> Path:
    """The job's host-memory checkpoint tier (ftrun/memtier.py), in this user's private
    parent: the agent owns it and removes it when the job ends."""
    return memtier.tier_dir(job_id, SHM)
