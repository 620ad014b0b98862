"""Rank directories of the memory tier that no rank on the host uses any more, and their removal.

A host's ranks are renumbered when the job is re-planned around it (a shrink that removes a lower
host, a new DP x PP plan): the host that held rank 1 holds rank 0 next. The new rank writes
`rank0/`, and `rank1/`, the old rank's two (or three) snapshot slots of the whole state, would
stay in /dev/shm until the job ends. In a long elastic job a host can hold many rank numbers in
turn, so that memory would grow with every renumbering.

The same goes for the peer copy's replicas (docs/peercopy.md) of ranks the job no longer has
(`replica/rank<R>/` with R at or above the world size, after a shrink): a shrink's restore may
read them, no ring pushes to them any more, and a spare's fetch asks only for ranks below the
world size.

So each rank claims its directory for its generation (`claims.CLAIM_FILE`, the claim format the
fences use), and after the rank's first persist in its generation it removes the directories of
the tier still claimed by an older generation of the job. Why that moment:

- Every rank of the generation has claimed its directory: each claimed it when its Manager
  started, and a persist needs every rank's snapshot, so all of them have started.
- Every rank has restored: a memory restore into a new layout reads the old ranks' slots
  (restore.py), and a rank saves, so persists, only after its restore.
- Storage now holds a step of this generation. What the old directories hold is the older
  timeline this generation restored from; a later restore finds this generation's snapshots or
  that persist.

The removal holds the tier's generation fence (fence.py) and renames each directory out of the
way (`.stale-rank<R>-<id>`: no scan reads it) before anything is deleted, so a zombie of an older
generation cannot take away what a newer one is about to restore from, and a scan never sees a
half-deleted directory. The deletion itself runs on a thread: freeing GiBs of tmpfs takes time
the training step should not wait for. A directory without a claim (an older ftrun's) is left
for the agent, which deletes the whole tier at job end, as it does anything a killed rank leaves.
"""

from __future__ import annotations

import os
import shutil
import stat
import threading
import uuid
from pathlib import Path

from ftrun.checkpoint.config import REPLICA_DIR
from ftrun.claims import CLAIM_FILE, Claim, read_claim

STALE_PREFIX = ".stale-"


def claim_rank_dir(directory: Path, claim: Claim) -> None:
    """Say which generation of the job uses this rank's directory (temp file + rename). OSError
    when it cannot: the directory is then only removed with the tier."""
    tmp = directory / f"{CLAIM_FILE}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, claim.encode())
    finally:
        os.close(fd)
    os.replace(tmp, directory / CLAIM_FILE)


def set_aside(tier: Path, mine: Claim, world_size: int) -> list[Path]:
    """Rename away every `rank<R>/` of `tier` claimed by an older generation of `mine`'s job,
    and every replica of a rank at or above `world_size`; returns the new paths, for
    `remove_later`. The caller holds the tier's fence."""
    moved = []
    for directory in _rank_dirs(tier):
        claim = read_claim(directory)
        if claim is not None and claim.job == mine.job and claim.generation < mine.generation:
            moved += _rename(directory, tier / f"{STALE_PREFIX}{directory.name}")
    for directory in _rank_dirs(tier / REPLICA_DIR):
        if int(directory.name.removeprefix("rank")) >= world_size:
            moved += _rename(directory, tier / f"{STALE_PREFIX}{REPLICA_DIR}-{directory.name}")
    return moved


def _rank_dirs(parent: Path) -> list[Path]:
    """The `rank<R>` directories of `parent` that are ours (not links)."""
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return []
    found = []
    for name in names:
        if not (name.startswith("rank") and name[4:].isdigit()):
            continue
        try:
            st = os.lstat(parent / name)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
            found.append(parent / name)
    return found


def _rename(directory: Path, prefix: Path) -> list[Path]:
    target = prefix.with_name(f"{prefix.name}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(directory, target)
    except OSError:  # another rank of the host set it aside first
        return []
    return [target]


def remove_later(paths: list[Path]) -> threading.Thread | None:
    """Delete the set-aside directories on a daemon thread (None when there are none)."""
    if not paths:
        return None

    def remove() -> None:
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)

    thread = threading.Thread(target=remove, name="ftrun-ckpt-stale-ranks", daemon=True)
    thread.start()
    return thread
