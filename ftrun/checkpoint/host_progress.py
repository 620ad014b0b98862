"""How far the ranks of this host have got: the newest step each has completed a snapshot of.

A restore from memory needs a step that every rank holds (restore.py), and the ranks' slots do
not turn together: a rank's copy of step N is waited for only at its optimizer step of N + 1, so
in data parallel another rank can have finished step N + 1, and copied it, while this one still
copies N. A rank that runs ahead must then keep N - 1, the newest step every rank has completed:
with three slots, one pinned by a persist, the only slot it could write N + 1 into holds N - 1
(docs/checkpoint.md, *Two slots or three*). So before a save writes over a snapshot the rank
reads how far the others have got, and waits while one of them has not completed a newer step
(copy_path.py; which slot a save takes is slot_table.py's).

Each rank keeps its record in its own directory of the tier, `rank<R>/progress`: `<run> <step>`,
replaced (temp file + rename) whenever a snapshot's manifest lands in the tier (MemoryTier.commit:
a copy's, or the live file's under a live snapshot, whose fallback is its own matter: live.py),
and at restore (the step restored). `<run>` is the Manager's nonce, the same on every rank of one
run (rank 0 broadcasts it), so a record an earlier run or generation left in these directories
is not taken for this one's. A rank whose snapshots leave the tier withdraws its record: nobody
waits for it. A record only ever holds a save back; what a restore loads is checked as before,
so a missing or wrong record costs at most the bound on steps lost, never exactness. The
directories are this user's alone (slots.py); a record is read never through a link, never
blocking, and one that cannot be read is no record.

Ranks on other hosts keep their tiers there and are not seen here: across hosts the bound holds
as far as their slots turn together (docs/checkpoint.md).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path

PROGRESS_FILE = "progress"
_RANK_DIR = re.compile(r"rank(\d+)")


def publish(directory: Path | None, *, run: str, step: int) -> None:
    """Record that this rank (its tier directory `directory`; None: no tier) has completed the
    snapshot of `step`. Where the record cannot be written (a full tier) it is withdrawn: an old
    one would hold the other ranks back for nothing."""
    if directory is None:
        return
    path = directory / PROGRESS_FILE
    tmp = directory / f"{PROGRESS_FILE}.{os.getpid()}.tmp"
    try:
        _unlink(tmp)
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        try:
            os.write(fd, f"{run} {step}\n".encode())
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        _unlink(tmp)
        withdraw(directory)


def withdraw(directory: Path | None) -> None:
    """This rank's copies are no longer in the tier: no rank waits for it."""
    if directory is not None:
        _unlink(directory / PROGRESS_FILE)


def steps(directory: Path | None, *, run: str) -> dict[int, int]:
    """Each rank of the host that has a record of run `run` (this one's too; `directory` is this
    rank's, in the job's tier): the newest step it has completed, by rank."""
    if directory is None:
        return {}
    root = directory.parent
    try:
        names = os.listdir(root)
    except OSError:
        return {}
    found = {}
    for name in names:
        match = _RANK_DIR.fullmatch(name)
        if match is not None:
            step = _read(root / name / PROGRESS_FILE, run)
            if step is not None:
                found[int(match.group(1))] = step
    return found


def behind(done: Mapping[int, int], step: int) -> list[int]:
    """The ranks that have not got past `step`, the one a save would write over: their newest
    completed step (`done`, by rank: steps()) is that one or older."""
    return sorted(r for r, newest in done.items() if newest <= step)


def _read(path: Path, run: str) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.pread(fd, 128, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        who, step = data.decode("ascii").split()
        return int(step) if who == run else None
    except (UnicodeDecodeError, ValueError):
        return None


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
