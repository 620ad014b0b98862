"""The run and job directories: refused when another user could change them, and written only
through a descriptor of the job directory, never through a link.

A run directory that another user can write (a /tmp/... path they made first, a group-shared
directory) lets them rename a live job directory and put their own in its place: the next
generation's rank logs then append through their links into the user's files, and `ftrun resume`
runs their config.json's script as the user. So, before anything is read or written:
- the run directory must be the user's (or root's) and closed to group and other writes, or else
  a sticky directory of the user or root (like /tmp): there nobody else can rename or remove
  what is ours;
- the job directory inside must be the user's and closed to group and other writes (0700, 0750
  with --group-readable): else refused with one line and a hint (UsageError, exit 2).
The job directory is then held open (O_DIRECTORY | O_NOFOLLOW) and every file ftrun creates or
appends there is opened relative to that descriptor with O_NOFOLLOW (O_EXCL where it is new,
temp + rename where it is replaced): a name swapped after the check is not followed.

Ground floor: imports only ftrun.errors, ftrun.filemodes and ftrun.private (owner/mode checks).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from ftrun import filemodes, private
from ftrun.errors import UsageError

HINT = (
    "use a directory of your own that no one else can write (--run-dir, FTRUN_RUN_DIR), or "
    "`chmod go-w` it; a shared directory like /tmp needs its sticky bit"
)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
MAX_READ = 16 << 20  # config.json and the like: far more than they ever hold


def _refuse(path: Path | str, why: str, st: os.stat_result, *, what: str) -> UsageError:
    return UsageError(
        f"{what} {path} is not safe to use: {why} ({private.describe(st)})",
        hint=HINT,
        data={"path": str(path), "uid": st.st_uid, "mode": stat.S_IMODE(st.st_mode)},
    )


def run_dir_shared(path: Path | str, st: os.stat_result) -> bool:
    """Whether a run directory is shared (a sticky directory others can write); raises when
    another user could change what is in it."""
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "it is not a directory", st, what="the run directory")
    if st.st_uid not in (os.geteuid(), 0):
        why = f"it is owned by {private.user_name(st.st_uid)}, not by you or root"
        raise _refuse(path, why, st, what="the run directory")
    if not st.st_mode & private.GROUP_OTHER_WRITE:
        return False
    if st.st_mode & stat.S_ISVTX:
        return True
    why = "group or other users can write to it (and it is not sticky)"
    raise _refuse(path, why, st, what="the run directory")


def check_job_dir(path: Path | str, st: os.stat_result) -> None:
    """The job directory: ours, and nobody else may write it (0700, or 0750 if group-readable)."""
    why = private.problem(st, directory=True, forbid=private.GROUP_OTHER_WRITE)
    if why is not None:
        raise _refuse(path, why, st, what="the job directory")


def check_file(path: Path | str, st: os.stat_result, *, what: str) -> None:
    """A file in the job directory to be trusted: a regular file of ours that nobody else may
    write (config.json, events.jsonl before `resume` reads them)."""
    why = private.problem(st, directory=False, forbid=private.GROUP_OTHER_WRITE)
    if why is not None:
        raise _refuse(path, why, st, what=what)


def check_run_dir(run_dir: Path, umask: int = filemodes.PRIVATE_UMASK) -> None:
    """The run directory exists (made with the mode `umask` allows), is safe (run_dir_shared) and
    writable; UsageError otherwise."""
    try:
        filemodes.make_dir(run_dir, umask, parents=True, exist_ok=True)
        fd = os.open(run_dir, _DIR_FLAGS)
    except OSError as e:
        raise _unwritable(run_dir, e) from None
    try:
        run_dir_shared(run_dir, os.fstat(fd))
        probe = f".ftrun-write-probe-{os.getpid()}-{secrets.token_hex(4)}"
        os.close(os.open(probe, _NEW_FILE | os.O_EXCL, 0o600, dir_fd=fd))
        os.unlink(probe, dir_fd=fd)
    except OSError as e:
        raise _unwritable(run_dir, e) from None
    finally:
        os.close(fd)


def _unwritable(run_dir: Path, e: OSError) -> UsageError:
    return UsageError(
        f"the run directory {run_dir} is not writable: {e.strerror or e}",
        hint="pass a writable --run-dir or set FTRUN_RUN_DIR",
    )


class JobDir:
    """An open, checked job directory. Files are opened relative to its descriptor with
    O_NOFOLLOW; names may have subdirectories ("logs/g1/rank0.log"), made as needed."""

    def __init__(self, fd: int, path: Path, umask: int) -> None:
        self.fd = fd
        self.path = path
        self.umask = umask

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        create: bool = True,
        exist_ok: bool = False,
        umask: int = filemodes.PRIVATE_UMASK,
    ) -> JobDir:
        """Check the run directory, make the job directory (and the run directory) if `create`
        and it is missing (FileExistsError if it is there, unless `exist_ok`), open it and check
        it. UsageError when either is not safe; OSError when they cannot be made or opened."""
        run_dir = path.parent
        if create:
            filemodes.make_dir(run_dir, umask, parents=True, exist_ok=True)
        run_fd = os.open(run_dir, _DIR_FLAGS)
        made = False
        try:
            run_dir_shared(run_dir, os.fstat(run_fd))
            if create:
                try:
                    os.mkdir(path.name, filemodes.dir_mode(umask), dir_fd=run_fd)
                    made = True
                except FileExistsError:
                    if not exist_ok:
                        raise
            try:
                fd = os.open(path.name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=run_fd)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                check_job_dir(path, os.lstat(path.name, dir_fd=run_fd))  # says why, and raises
                raise
        finally:
            os.close(run_fd)
        try:
            if made:  # mkdir's mode went through the process umask: set it as asked
                os.fchmod(fd, filemodes.dir_mode(umask))
            check_job_dir(path, os.fstat(fd))
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, path, umask)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> JobDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _parent(self, name: str, *, make: bool) -> Iterator[tuple[int, str]]:
        """(descriptor of the directory that holds `name`, its last component); an OSError in
        the block names the whole path."""
        *dirs, leaf = name.split("/")
        fd = os.dup(self.fd)
        try:
            for part in dirs:
                if make:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, filemodes.dir_mode(self.umask), dir_fd=fd)
                sub = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = sub
                if os.fstat(fd).st_uid != os.geteuid():
                    raise OSError(errno.EPERM, f"{part} is not ours", str(self.path / name))
            yield fd, leaf
        except OSError as e:
            e.filename = str(self.path / name)
            raise
        finally:
            os.close(fd)

    def open_append(self, name: str, mode: int = 0o666) -> int:
        """A descriptor that appends to `name` (made with `mode`, less the umask, if missing).
        A link, a FIFO or another user's file there is refused (OSError), never opened."""
        with self._parent(name, make=True) as (parent, leaf):
            fd = os.open(leaf, _NEW_FILE | os.O_APPEND, mode, dir_fd=parent)
        return _regular_ours(fd, self.path / name)

    def create_new(self, name: str, mode: int = 0o666) -> int:
        """A descriptor of a new file `name` (O_EXCL: FileExistsError if anything is there)."""
        with self._parent(name, make=True) as (parent, leaf):
            fd = os.open(leaf, _NEW_FILE | os.O_EXCL, mode, dir_fd=parent)
        return _regular_ours(fd, self.path / name)

    def replace(self, name: str, data: bytes, mode: int | None = None) -> None:
        """Write `data` to a new temporary file beside `name` and rename it over `name`: a reader
        sees the old file or the new one, and a link at `name` is replaced, not followed. The
        mode: as the job's umask allows [0600 or 0640], or `mode` (0600 for secrets)."""
        mode = 0o666 & ~self.umask if mode is None else mode
        with self._parent(name, make=True) as (parent, leaf):
            tmp = f".{leaf}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
            fd = os.open(tmp, _NEW_FILE | os.O_EXCL, mode, dir_fd=parent)
            try:
                _write_all(fd, data)
                os.fchmod(fd, mode)
                os.rename(tmp, leaf, src_dir_fd=parent, dst_dir_fd=parent)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=parent)
                raise
            finally:
                os.close(fd)

    def read(self, name: str, *, what: str, limit: int = MAX_READ) -> bytes:
        """The bytes of `name`, once check_file has passed on what was opened (not followed)."""
        with self._parent(name, make=False) as (parent, leaf):
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            try:
                fd = os.open(leaf, flags, dir_fd=parent)
            except OSError as e:
                if e.errno == errno.ELOOP:  # a link: say so, as for any file not ours alone
                    check_file(self.path / name, os.lstat(leaf, dir_fd=parent), what=what)
                raise
        try:
            check_file(self.path / name, os.fstat(fd), what=what)
            chunks: list[bytes] = []
            size = 0
            while size < limit and (chunk := os.read(fd, min(1 << 20, limit - size))):
                chunks.append(chunk)
                size += len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def lstat(self, name: str) -> os.stat_result:
        with self._parent(name, make=False) as (parent, leaf):
            return os.lstat(leaf, dir_fd=parent)

    def unlink(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError), self._parent(name, make=False) as (p, leaf):
            os.unlink(leaf, dir_fd=p)


def _regular_ours(fd: int, path: Path) -> int:
    """`fd` (blocking again) if it is a regular file of ours; else closed, and OSError."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise OSError(errno.EPERM, "not a regular file of ours", str(path))
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
