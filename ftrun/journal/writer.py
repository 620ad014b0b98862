"""The job directory on disk: resolved config, the append-only event log, and per-rank logs.

    <run dir>/<job id>/config.json
    <run dir>/<job id>/events.jsonl          one JSON event per line, flushed per event
    <run dir>/<job id>/logs/g<G>/rank<R>.log  what rank R printed in generation G
    <run dir>/<job id>/logs/g<G>/<host>.torchrun.log

Only the controller writes here (this module); `status` and `inspect` only read
(journal_read.py), and tolerate a torn last line, because the controller may have been killed in
the middle of writing it.

The journal must get its last event even when the machine is short of something (docs/security.md:
a flood of connections can use up file descriptors, a chatty rank the disk). So the writer:
- keeps events.jsonl open from the start, and writes each event with os.write (no buffer that a
  failed write leaves half full); an event it cannot write now waits, in order, for the next one;
- holds RESERVE_BYTES of disk in a reserve file beside it, and frees it at the first "disk full",
  so the events that follow (the job's end among them) have room;
- never lets a rank log that cannot be opened or written take the controller down: the lines are
  dropped and counted, once journaled as `log_write_failed`, and after a "disk full" rank logs
  stop for good, so they cannot eat the reserve meant for the events.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from ftrun import filemodes
from ftrun.errors import UsageError
from ftrun.jobfiles import JobDir

EVENTS_FILE = "events.jsonl"
CONFIG_FILE = "config.json"
RESERVE_FILE = ".events-reserve"
RESERVE_BYTES = 256 * 1024  # a few thousand events: the end of a job and then some
MAX_PENDING_EVENTS = 100_000
# What a log stream's name may hold: it becomes a file name in the job directory.
_UNSAFE_IN_NAME = re.compile(r"[^A-Za-z0-9_.@:+-]")

log = logging.getLogger("ftrun.journal")


class Journal:
    """Appends events and log lines for one job. Not thread-safe: the controller's loop owns it."""

    def __init__(
        self,
        job_dir: Path,
        *,
        existing: bool = False,
        umask: int = filemodes.PRIVATE_UMASK,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """A new job directory, or with `existing` one made beforehand (by `ftrun sbatch`) or
        a job's own to resume (a requeued Slurm job): its events are appended to. One we
        create gets the mode `umask` allows (0700 by default), whatever the process umask."""
        self.job_dir = job_dir
        self.clock = clock  # wall time; `ftrun simulate` journals in simulated time
        # Held open, checked (not another user's, not open to their writes: ftrun/jobfiles.py);
        # every file here is opened through it, never through a link.
        self.files = JobDir.open(job_dir, exist_ok=existing, umask=umask)
        try:
            self._events_fd = self.files.open_append(EVENTS_FILE, 0o666 & ~umask)
            if (
                existing
                and os.fstat(self._events_fd).st_size > 0
                and not _ends_with_newline(self.files)
            ):
                os.write(self._events_fd, b"\n")  # a killed controller's torn last line stays apart
        except OSError as e:
            self.files.close()
            raise UsageError(
                f"cannot create the job directory {job_dir}: {e.strerror or e}",
                hint="pass a writable --run-dir or set FTRUN_RUN_DIR",
            ) from None
        self._pending: deque[bytes] = deque()
        self._reserve = _make_reserve(self.files)
        self._logs: dict[tuple[int, str], IO[str]] = {}
        self._log_failures: dict[str, int] = {}  # errno name → lines dropped
        self._logs_stopped = False
        # Called with each event's line as it is written: the standby's replica of the journal
        # (controller/standby_desk.py).
        self.followers: list[Callable[[str], None]] = []

    def write_config(self, config: dict[str, Any]) -> None:
        data = (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()
        self.files.replace(CONFIG_FILE, data)

    def record(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Append one event. Never raises for the disk's sake: an event that cannot be written
        now is kept and written before the next one (see the module's docstring)."""
        event = {"t": self.clock(), "kind": kind, **fields}
        line = json.dumps(event, separators=(",", ":"), default=str) + "\n"
        for follow in self.followers:
            follow(line)
        if len(self._pending) < MAX_PENDING_EVENTS:
            self._pending.append(line.encode("utf-8", "backslashreplace"))
        self._write_pending()
        return event

    def _write_pending(self) -> None:
        while self._pending:
            data = self._pending[0]
            try:
                written = os.write(self._events_fd, data)
            except OSError as e:
                if e.errno == errno.ENOSPC and self._free_reserve():
                    continue
                log.error("cannot write the journal (%s); %d event(s) wait", e, len(self._pending))
                return
            if written < len(data):  # short write (disk full part way): the rest goes next
                self._pending[0] = data[written:]
                continue
            self._pending.popleft()

    def _free_reserve(self) -> bool:
        """The disk is full: give the events the room held for them, and stop rank logs from
        taking it back. False when it was already given."""
        if not self._reserve:
            return False
        try:
            self.files.unlink(RESERVE_FILE)
        except OSError:
            pass
        self._reserve = False
        self._stop_logs("the disk is full (ENOSPC)")
        return True

    def _stop_logs(self, why: str) -> None:
        if self._logs_stopped:
            return
        self._logs_stopped = True
        self._close_logs()
        log.error("rank logs stopped: %s", why)
        self.record("logs_stopped", reason=why)

    def log_path(self, generation: int, stream: str) -> Path:
        """Where a stream's lines go (_log_name)."""
        return self.job_dir / _log_name(generation, stream)

    def append_log(self, generation: int, stream: str, lines: Iterable[str]) -> None:
        """Append a stream's lines. Lines that cannot be written (no file descriptor left, no
        disk, an I/O error) are dropped and counted, never raised: the controller goes on."""
        lines = list(lines)
        if self._logs_stopped:
            self._log_failures["stopped"] = self._log_failures.get("stopped", 0) + len(lines)
            return
        key = (generation, stream)
        try:
            handle = self._logs.get(key)
            if handle is None:
                fd = self.files.open_append(_log_name(generation, stream))
                handle = self._logs[key] = open(fd, "a", encoding="utf-8", errors="replace")
            handle.writelines(line + "\n" for line in lines)
            handle.flush()
        except OSError as e:
            self._log_failed(key, e, len(lines))

    def _log_failed(self, key: tuple[int, str], e: OSError, lines: int) -> None:
        reason = errno.errorcode.get(e.errno or 0, type(e).__name__)
        first = reason not in self._log_failures
        self._log_failures[reason] = self._log_failures.get(reason, 0) + lines
        handle = self._logs.pop(key, None)
        if handle is not None:
            try:
                handle.close()  # its buffer may hold what failed; drop it with the handle
            except OSError:
                pass
        if first:
            log.error("cannot write the log of %s: %s", key[1], e)
            self.record("log_write_failed", gen=key[0], stream=key[1], reason=reason)
        if e.errno == errno.ENOSPC:
            self._free_reserve()

    @property
    def dropped_log_lines(self) -> dict[str, int]:
        """Lines dropped so far, by reason (an errno name, or "stopped")."""
        return dict(self._log_failures)

    def close_generation_logs(self, generation: int) -> None:
        for key in [k for k in self._logs if k[0] == generation]:
            self._logs.pop(key).close()

    def _close_logs(self) -> None:
        for handle in self._logs.values():
            try:
                handle.close()
            except OSError:  # its buffer could not be written: counted where it failed
                pass
        self._logs.clear()

    def close(self) -> None:
        self._close_logs()
        if self._events_fd < 0:
            return
        if self._log_failures:
            self.record("log_lines_dropped", by_reason=self._log_failures)
        self._write_pending()
        try:
            os.fsync(self._events_fd)
        except OSError as e:
            log.error("cannot sync the journal: %s", e)
        os.close(self._events_fd)
        self._events_fd = -1
        if self._reserve:
            try:
                self.files.unlink(RESERVE_FILE)
            except OSError:
                pass
            self._reserve = False
        self.files.close()


def _log_name(generation: int, stream: str) -> str:
    """A stream's log in the job directory. Its name (a rank, a host) is made a plain file
    name, whatever it holds: no separators, no leading dot."""
    name = _UNSAFE_IN_NAME.sub("_", stream).lstrip(".") or "_"
    return f"logs/g{int(generation)}/{name[:200]}.log"


def _make_reserve(files: JobDir) -> bool:
    """RESERVE_BYTES of real blocks (written, not sparse) that the journal frees when the disk
    fills up; False when even that cannot be had (then there is nothing to give back)."""
    try:
        files.unlink(RESERVE_FILE)  # a killed controller's
        fd = files.create_new(RESERVE_FILE, 0o600)
        try:
            os.write(fd, bytes(RESERVE_BYTES))
        finally:
            os.close(fd)
    except OSError:
        try:
            files.unlink(RESERVE_FILE)
        except OSError:
            pass
        return False
    return True


def _ends_with_newline(files: JobDir) -> bool:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(EVENTS_FILE, flags, dir_fd=files.fd)
    try:
        return os.pread(fd, 1, os.fstat(fd).st_size - 1) == b"\n"
    finally:
        os.close(fd)
