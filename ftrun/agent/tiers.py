"""This user's checkpoint memory tiers on this host: the agent's own job's, made and marked at the
agent's start, and sweeping the tiers whose agent and ranks are gone.

A tier is `/dev/shm/ftrun-<uid>/<job>/` (ftrun.checkpoint.memory_tier_dir): the agent removes its
job's at its end, but an agent that dies without its `finally` (the OOM killer, a SIGKILL) left it
behind for good, and it can hold 3 x the ranks' state. So every agent marks its job's tier with a file naming itself
(`.agent-<pid>-<start time>`), and at its start sweeps every tier of this user's whose marks all
name processes that no longer exist (a pid reused since has another start time) and whose files
no process maps (a rank that outlived its agent is still using it). A tier without a mark (plain
torchrun, where whoever set the job id deletes it; an older ftrun) is left alone.

It also reports the tier root's size and free space, which the agent sends with its hello: the
controller tells the user at launch when /dev/shm is too small to hold a tier (controller/fleet.py).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import psutil

from ftrun import private
from ftrun.agent.workdir import remove_if_ours
from ftrun.errors import UsageError

log = logging.getLogger("ftrun.agent")

MARK_PREFIX = ".agent-"
START_TIME_SLACK_S = 1.0


def mark(tier: Path) -> Path | None:
    """Make the job's tier (0700, in the user's 0700 parent) and mark it as this agent's; None
    when it cannot be made (the ranks then say why, as the root cause: capacity.py)."""
    try:
        private.ensure_dir(
            tier,
            forbid=private.GROUP_OTHER_ANY,
            what="checkpoint memory tier",
            hint="remove it if it is a leftover of yours",
            error=UsageError,
        )
        me = psutil.Process()
        path = tier / f"{MARK_PREFIX}{me.pid}-{int(me.create_time() * 1000)}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.close(fd)
        return path
    except (UsageError, OSError, psutil.Error) as exc:
        log.warning("the checkpoint memory tier %s is not marked as this agent's: %s", tier, exc)
        return None


def sweep(parent: Path, *, keep: Path | None = None) -> list[Path]:
    """Remove the tiers in `parent` (this user's `ftrun-<uid>`) whose agents and ranks are gone,
    except `keep`; returns them. Never raises: a sweep only frees memory."""
    try:
        st = os.lstat(parent)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            return []
        tiers = sorted(parent.iterdir())
    except OSError:
        return []
    candidates = [t for t in tiers if t != keep and _orphaned(t)]
    if not candidates:
        return []
    mapped = _mapped_under(candidates)
    removed = []
    for tier in candidates:
        if tier not in mapped and remove_if_ours(tier):
            log.info("swept the memory tier %s: its agent and ranks are gone", tier)
            removed.append(tier)
    return removed


def _orphaned(tier: Path) -> bool:
    """Marked by agents, none of which still runs."""
    try:
        marks = [n for n in os.listdir(tier) if n.startswith(MARK_PREFIX)]
    except OSError:
        return False
    return bool(marks) and not any(_alive(name) for name in marks)


def _alive(name: str) -> bool:
    pid, _, started = name[len(MARK_PREFIX) :].partition("-")
    try:
        proc = psutil.Process(int(pid))
        return abs(proc.create_time() * 1000 - int(started)) <= START_TIME_SLACK_S * 1000
    except (ValueError, psutil.NoSuchProcess):
        return False
    except psutil.Error:  # cannot tell: keep it
        return True


def _mapped_under(tiers: list[Path]) -> set[Path]:
    """Which of `tiers` some process maps a file of (/proc/<pid>/maps of this user's processes)."""
    prefixes = {f"{t}/": t for t in tiers}
    found: set[Path] = set()
    for pid in psutil.pids():
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
                text = maps.read()
        except OSError:
            continue
        for prefix, tier in prefixes.items():
            if prefix in text:
                found.add(tier)
    return found


def space(root: Path) -> dict[str, int]:
    """The tier root's size and free space in bytes (hello's `shm_total`, `shm_free`)."""
    try:
        st = os.statvfs(root)
    except OSError:
        return {}
    return {"shm_total": st.f_blocks * st.f_frsize, "shm_free": st.f_bavail * st.f_frsize}
