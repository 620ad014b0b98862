"""Owner-only directories and key files: made so that no other user can have made them first, and
refused when another user could read or replace them.

ftrun keeps a few things where another user of the host can reach the path: the checkpoint memory
tier in /dev/shm (writable by everyone, under a name anyone can guess), the checkpoint key in the
job directory and in the user's config directory. A path there is trusted only when `os.lstat`
(never `stat`: a symbolic link is refused, not followed) shows what ftrun itself would have made:
a directory or a regular file owned by this user, which no other user can change (or, where the
caller says so, read). What ftrun creates it creates with mode 0700 (directories, missing parents
included) or 0600 (files, O_EXCL | O_NOFOLLOW), so it never takes over a path planted before it.

Ground floor: imports only ftrun.errors; the controller (the job's key) and ftrun.checkpoint (the
memory tier, the user's key) both use it, each raising its own FtrunError subclass.
"""

from __future__ import annotations

import errno
import os
import pwd
import secrets
import stat
import time
from collections.abc import Callable
from pathlib import Path

from ftrun.errors import FtrunError, UsageError

KEY_BYTES = 32  # HMAC-SHA256 keys: 256 bits, written as 64 hex digits
MIN_KEY_BYTES = 16
GROUP_OTHER_WRITE = 0o022  # others may list the directory, not change it
GROUP_OTHER_ANY = 0o077  # others may not even read it
_MAX_KEY_FILE = 4096

ErrorType = Callable[..., FtrunError]


def user_name(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def describe(st: os.stat_result) -> str:
    """`owner uid 65534 (nobody), mode drwxrwxrwx (0777)`: what a refusal shows."""
    mode = st.st_mode
    return f"owner {user_name(st.st_uid)}, mode {stat.filemode(mode)} ({stat.S_IMODE(mode):04o})"


def problem(st: os.stat_result, *, directory: bool, forbid: int) -> str | None:
    """Why another user could have made or could change this path; None when it is ours alone.

    `forbid`: the group/other permission bits that are refused (GROUP_OTHER_WRITE or _ANY)."""
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        return "it is a symbolic link"
    if directory and not stat.S_ISDIR(mode):
        return "it is not a directory"
    if not directory and not stat.S_ISREG(mode):
        return "it is not a regular file"
    if st.st_uid != os.geteuid():
        return f"it is owned by {user_name(st.st_uid)}, not by {user_name(os.geteuid())}"
    if mode & forbid & 0o022:
        return "group or other users can write to it"
    if mode & forbid:
        return "group or other users can read it"
    if not directory and st.st_nlink != 1:
        return f"it has {st.st_nlink} hard links"
    return None


def make_dirs(path: Path, *, mode: int = 0o700) -> None:
    """Create `path` and every missing parent, each with `mode` (not the umask's default)."""
    missing = []
    here = path
    while not os.path.lexists(here) and here != here.parent:
        missing.append(here)
        here = here.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode)
        except FileExistsError:  # another rank of this job made it first: checked by the caller
            pass


def ensure_dir(path: Path, *, forbid: int, what: str, hint: str, error: ErrorType) -> None:
    """Make `path` (0700, parents too) unless it exists; then refuse it unless it is ours alone."""
    try:
        make_dirs(path)
        st = os.lstat(path)
    except OSError as exc:
        raise error(f"cannot create {what} {path}: {exc.strerror or exc}", hint=hint) from None
    refuse_unless_ours(path, st, directory=True, forbid=forbid, what=what, hint=hint, error=error)


def refuse_unless_ours(
    path: Path | str,
    st: os.stat_result,
    *,
    directory: bool,
    forbid: int,
    what: str,
    hint: str,
    error: ErrorType,
) -> None:
    why = problem(st, directory=directory, forbid=forbid)
    if why is not None:
        raise error(
            f"{what} {path} is not safe to use: {why} ({describe(st)})",
            hint=hint,
            data={"path": str(path), "uid": st.st_uid, "mode": stat.S_IMODE(st.st_mode)},
        )


RACING_LINK_WAIT_S = 1.0


def parse_key(text: str, *, source: str, hint: str, error: ErrorType = UsageError) -> bytes:
    """A key written as hex (64 digits for 32 bytes); at least MIN_KEY_BYTES bytes."""
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise error(f"{source} is not a key: expected hex digits", hint=hint) from None
    if len(key) < MIN_KEY_BYTES:
        raise error(
            f"{source} holds a {len(key)}-byte key; at least {MIN_KEY_BYTES} bytes are needed",
            hint=hint,
        )
    return key


def key_file(
    path: Path,
    *,
    dir_forbid: int,
    what: str,
    hint: str,
    error: ErrorType = UsageError,
    dir_fd: int | None = None,
) -> bytes:
    """The key in `path`, made (32 random bytes, mode 0600) if there is none yet.

    The directory is created 0700 if missing and refused unless ours (group/other may not have
    the `dir_forbid` bits); the file is refused unless it is a regular file of ours with mode
    0600 or stricter. A new key is written whole to a temporary file (O_EXCL | O_NOFOLLOW, 0600)
    and linked into place: of processes that race to make it, exactly one key wins, and nobody
    ever reads a half-written one. With `dir_fd` (a descriptor of a directory already checked,
    ftrun/jobfiles.py) every name is opened relative to it, never by its path."""
    if dir_fd is None:
        ensure_dir(
            path.parent, forbid=dir_forbid, what=f"the directory of {what}", hint=hint, error=error
        )
    try:
        return _read_key(path, what=what, hint=hint, error=error, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    name = path.name if dir_fd is not None else path
    tmp = f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    tmp = tmp if dir_fd is not None else str(path.with_name(tmp))
    try:
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=dir_fd,
        )
        try:
            os.write(fd, (secrets.token_hex(KEY_BYTES) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except FileExistsError:  # another process made it first: its key is the one
            pass
    except OSError as exc:
        raise error(f"cannot create {what} {path}: {exc.strerror or exc}", hint=hint) from None
    finally:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
    return _read_key(path, what=what, hint=hint, error=error, dir_fd=dir_fd)


def _read_key(
    path: Path, *, what: str, hint: str, error: ErrorType, dir_fd: int | None = None
) -> bytes:
    name = path.name if dir_fd is not None else path
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            st = os.lstat(name, dir_fd=dir_fd)
            refuse_unless_ours(
                path, st, directory=False, forbid=GROUP_OTHER_ANY, what=what, hint=hint, error=error
            )
        if isinstance(exc, FileNotFoundError):
            raise
        raise error(f"cannot read {what} {path}: {exc.strerror or exc}", hint=hint) from None
    try:
        st = os.fstat(fd)
        deadline = time.monotonic() + RACING_LINK_WAIT_S
        while st.st_nlink == 2 and time.monotonic() < deadline:
            # A racing creator's temporary name, linked to this file and unlinked right after
            # (key_file): give it a moment before calling a second link foreign.
            time.sleep(0.01)
            st = os.fstat(fd)
        refuse_unless_ours(
            path, st, directory=False, forbid=GROUP_OTHER_ANY, what=what, hint=hint, error=error
        )
        data = os.read(fd, _MAX_KEY_FILE)
    finally:
        os.close(fd)
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        text = "?"
    return parse_key(text, source=f"{what} {path}", hint=hint, error=error)
