"""Generation fences: a stale generation's writes are refused where they could do harm.

When a host is lost, its ranks may live on (a partition cuts it off from the controller, not from
the shared storage or, on the testbed, from /dev/shm). The next generation starts at once instead
of waiting out the lost agent's fence timeout, so for a while two generations of the job may write
to the same checkpoint directory and memory tier. A fence makes that harmless:

- `<dir>/.generation` holds the newest (job, generation) that has claimed the directory
  (ftrun/claims.py). Every
  rank of a generation *advances* it when its checkpoint Manager starts, before it reads
  anything there, under an exclusive flock.
- Every write that publishes state (the storage commit's rename and prune, a memory-tier slot's
  copy and manifest) *holds* the fence with a shared flock for as long as it writes, and is
  refused (`Superseded`) if a newer generation of the job, or another job, has claimed the
  directory.

So once a new generation has advanced the fence, no older one can publish anything there, and a
write that began before is complete before the new generation reads (the advance waits for it).
Writes that publish nothing (a rank's part files under its own generation's temporary directory)
need no fence: nothing ever reads them but that generation's commit, and the next prune removes
them.

Pure Python, no torch: the persist worker imports it. Filesystems without flock (some FUSE
mounts) fall back to checking without a lock, and say so once: the refusal still holds for every
write that starts after the advance, only one in flight at that moment could land.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ftrun.checkpoint.errors import CheckpointError
from ftrun.claims import CLAIM_FILE, Claim

FENCE_TIMEOUT_S = 60.0  # how long a write or an advance waits for the lock
LOCK_POLL_S = 0.005
_no_flock_warned = False


class Superseded(CheckpointError):
    """This rank's generation has been replaced: a newer generation (or another job) claimed the
    checkpoint directory, so nothing this rank writes there may be published. The rank is a
    zombie of a lost host; it should stop."""

    HINT = "nothing to do: the job goes on without this rank, which stops here"

    def __init__(self, message: str) -> None:
        super().__init__(message, hint=self.HINT)

    @classmethod
    def of(cls, directory: Path, mine: Claim, theirs: Claim) -> Superseded:
        who = (
            f"generation {theirs.generation}"
            if theirs.job == mine.job
            else f"job {theirs.job or '(no id)'}"
        )
        return cls(
            f"generation {mine.generation} of job {mine.job or '(no id)'} may no longer write to "
            f"{directory}: {who} has claimed it (this rank's host was declared lost and replaced)"
        )


class GenerationFence:
    """The fence of one directory, for one rank's (job, generation). Thread-safe enough for its
    use: one `hold` at a time per instance (a rank's snapshot thread, or its persist worker)."""

    def __init__(self, directory: Path, *, job: str, generation: int, timeout_s: float) -> None:
        self.directory = directory
        self.mine = Claim(job, generation)
        self.timeout_s = timeout_s
        self._fd: int | None = None
        self._held = False

    # -- the two operations --------------------------------------------------------------------

    def advance(self) -> Claim | None:
        """Claim the directory for this generation (before reading anything in it); returns the
        previous claim. Superseded if a newer generation of this job already claimed it."""
        with self._locked(fcntl.LOCK_SH):  # most ranks find a peer's claim: no writer's lock
            current = self._read()
            if current == self.mine:
                return current
        with self._locked(fcntl.LOCK_EX):
            current = self._read()
            if current is not None and current.job == self.mine.job:
                if current.generation > self.mine.generation:
                    raise Superseded.of(self.directory, self.mine, current)
                if current.generation == self.mine.generation:
                    return current  # a peer rank of this generation was first
            self._write(self.mine)
            return current

    @contextmanager
    def hold(self) -> Iterator[None]:
        """While inside, no newer generation can claim the directory; Superseded on entry if one
        already has."""
        self.acquire()
        try:
            yield
        finally:
            self.release()

    def acquire(self) -> None:
        """`hold` split in two, for a write that starts on one thread and ends on another."""
        self._lock(fcntl.LOCK_SH)
        try:
            current = self._read()
            if current is not None and current != self.mine and not self._older(current):
                raise Superseded.of(self.directory, self.mine, current)
        except BaseException:
            self._unlock()
            raise
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._unlock()

    def close(self) -> None:
        self.release()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # -- the file and its lock -----------------------------------------------------------------

    def _older(self, current: Claim) -> bool:
        """The claim on file is this job's, from an older generation: one that never advanced
        (a save without a restore in an older ftrun) cannot have a newer one behind it."""
        return current.job == self.mine.job and current.generation < self.mine.generation

    def _open(self) -> int:
        if self._fd is None:
            path = self.directory / CLAIM_FILE
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            try:
                fd = os.open(path, flags, 0o600)
            except OSError as exc:  # ELOOP: a link; ENXIO: a FIFO without a writer...
                raise _planted(path, exc.strerror or str(exc)) from None
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                os.close(fd)
                raise _planted(path, "not a regular file of this user's")
            self._fd = fd
        return self._fd

    @contextmanager
    def _locked(self, how: int) -> Iterator[None]:
        self._lock(how)
        try:
            yield
        finally:
            self._unlock()

    def _lock(self, how: int) -> None:
        """flock with a deadline: a stale process that holds the fence while frozen must not
        hang a new generation's start for ever."""
        fd = self._open()
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.flock(fd, how | fcntl.LOCK_NB)
                return
            except OSError as exc:
                if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                    _warn_no_flock(self.directory, exc)
                    return
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
            if time.monotonic() > deadline:
                raise CheckpointError(
                    f"the generation fence of {self.directory} stayed locked for "
                    f"{self.timeout_s:g} s",
                    hint="a process of an older generation holds it (a frozen host?): stop it",
                )
            time.sleep(LOCK_POLL_S)

    def _unlock(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _read(self) -> Claim | None:
        return Claim.decode(os.pread(self._open(), 256, 0))

    def _write(self, claim: Claim) -> None:
        fd = self._open()
        data = claim.encode()
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        os.fsync(fd)


def _planted(path: Path, why: str) -> CheckpointError:
    return CheckpointError(
        f"cannot use the generation fence {path}: {why}",
        hint="another user may have planted it: remove it",
    )


def _warn_no_flock(directory: Path, exc: OSError) -> None:
    global _no_flock_warned
    if not _no_flock_warned:
        _no_flock_warned = True
        print(
            f"[ftrun.checkpoint] warning: {directory} does not support flock ({exc.strerror}); "
            "stale generations are refused without a lock (docs/fencing.md)",
            file=sys.stderr,
            flush=True,
        )
