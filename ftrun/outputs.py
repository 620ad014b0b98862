"""Files a user asks ftrun to write (inspect --html/--png, profile --out): written whole to a new
temporary file beside the target and renamed over it, never through a link.

The target may be in a directory other users can write (a shared project directory, /tmp).
Writing by path there follows a link planted at the name and overwrites whatever it points to,
as the user. So the temporary file is created with O_EXCL | O_NOFOLLOW relative to a
descriptor of the directory, and renamed onto the name: a link there is replaced, not followed.
A name that is another user's file, or a link, or not a regular file is refused (UsageError, one
line and a hint): it is not ours to replace. A reader sees the old file or the new one, whole.

Ground floor: imports only ftrun.errors and ftrun.private.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

from ftrun import private
from ftrun.errors import UsageError


def write_output(path: Path, data: bytes, *, flag: str = "the output") -> Path:
    """Write `data` to `path` (temp + rename, see above); its absolute path. OSError for what the
    system refuses (no such directory, not writable), UsageError for what ftrun refuses."""
    path = Path(os.path.abspath(path))
    if not path.name:
        raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _check_target(path, dir_fd, flag)
        tmp = f".{path.name[:200]}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o666, dir_fd=dir_fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.close(fd)
            fd = -1
            os.rename(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
    finally:
        os.close(dir_fd)
    return path


def _check_target(path: Path, dir_fd: int, flag: str) -> None:
    try:
        st = os.lstat(path.name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
    why = private.problem(st, directory=False, forbid=0)
    if why is not None and not why.endswith("hard links"):
        raise UsageError(
            f"{flag} {path} is not replaced: {why} ({private.describe(st)})",
            hint=f"remove it if it should go, or give {flag} a name in a directory of your own",
            data={"path": str(path), "uid": st.st_uid, "mode": stat.S_IMODE(st.st_mode)},
        )
