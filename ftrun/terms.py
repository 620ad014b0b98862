"""A job's term on each host: the highest controller term this host has obeyed.

Each run of a job's controller has a term (its run number: the launch is 1, a resume or a
standby's takeover the next). When a standby takes a job over, its agents learn the new term
(the `term` message) and their host keeps it here. From then on what an older controller asks
of this host is refused, because it can only come from a controller that was cut off and came
back: a new agent it starts exits at once, its sweep kills nothing, and the word `fence` it
writes on an agent's stdin is ignored (docs/standby.md). As generations fence a stale
generation's writes (docs/fencing.md), terms fence a stale controller's orders.

A file in this user's private `/dev/shm/ftrun-<uid>/` (memtier.py), so it is per host, dies
with the host's memory like the ranks it protects, and no other user can write it. Ground
floor: imports nothing of ftrun but memtier.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ftrun import memtier


def path(job_id: str, root: Path | str = memtier.ROOT) -> Path:
    return Path(root) / memtier.user_dir_name() / f"{job_id}.term"


def current(job_id: str, root: Path | str = memtier.ROOT) -> int:
    """The highest term this host has obeyed for the job (0: none yet)."""
    try:
        return int(path(job_id, root).read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def obey(job_id: str, term: int, root: Path | str = memtier.ROOT) -> bool:
    """Record `term` if it is the highest yet; False when a newer term leads this host."""
    have = current(job_id, root)
    if term < have:
        return False
    # Term 1 (the launch) needs no file: a host without one is at term 1 at most. So a job that
    # never changed controllers leaves nothing here, whatever way its agents end.
    if term > max(have, 1):
        target = path(job_id, root)
        with contextlib.suppress(OSError):
            target.parent.mkdir(mode=0o700, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{os.getpid()}")
            tmp.write_text(f"{term}\n")
            os.replace(tmp, target)
    return True


def superseded(job_id: str, term: int, root: Path | str = memtier.ROOT) -> bool:
    """Whether a newer controller than `term` leads the job on this host."""
    return current(job_id, root) > term


def forget(job_id: str, root: Path | str = memtier.ROOT) -> None:
    """The job ended: its term is of no more use here."""
    with contextlib.suppress(OSError):
        path(job_id, root).unlink()
