"""Give a forked process its own command line and environment, as `ps`, `htop`, `pkill -f` and
/proc/PID/environ read them.

A warm-started rank is a fork of the zygote, so the kernel still shows the zygote's argv and
environment block for it: a user who runs `pkill -f train.py` or looks for their script in
`htop` must find the rank, see which rank it is, and find `RANK` and the other torchrun variables
in /proc/PID/environ as in a cold rank. The kernel reads both from the process's own memory
(arg_start..arg_end and env_start..env_end in /proc/PID/stat), so we write them there, as
setproctitle(3) does.

Details that keep this honest:
- Room: neither area can grow, so the agent starts the zygote with a padding argument
  (`title_room()`) and a padding variable (`env_room()`); every fork inherits both areas, and a
  title or an environment up to their size fits. What does not fit is left as it was.
- The argv area is filled with the title, a NUL, then spaces up to its last byte. A non-NUL last
  byte is the kernel's sign that the title was rewritten (fs/proc/base.c, get_mm_cmdline): it
  then returns the text up to the first NUL, which `ps` shows and psutil splits on spaces.
- The environment area gets the process's `NAME=value` entries, each ended by a NUL, then NULs to
  its end (a double NUL ends the block for psutil and for tools that split on NUL and skip empty
  entries). The interpreter copied the block into `os.environ` at start-up and libc's `environ`
  points at its own copies once `os.environ` is replaced (as_main.prepare()); `set_environ()`
  checks that no entry of libc's `environ` still points into the area before it writes.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping

from ftrun import envcontract

ROOM_BYTES = 4096
# A rank's environment is the agent's plus torchrun's and ftrun's variables (a few KiB); the
# padding variable adds this much room on top of the zygote's own block. A single variable may
# not exceed 128 KiB (MAX_ARG_STRLEN).
ENV_ROOM_BYTES = 32 * 1024
ENV_ROOM_NAME = envcontract.ENV_ROOM


def title_room() -> str:
    """An argument for the zygote's command line that reserves room for its forks' titles."""
    return " " * (ROOM_BYTES - 1)


def env_room() -> dict[str, str]:
    """A variable for the zygote's environment that reserves room for its forks' environments.
    The forks replace os.environ with their own, so it reaches no rank."""
    return {ENV_ROOM_NAME: " " * ENV_ROOM_BYTES}


def rank_title(env: Mapping[str, str], argv: list[str], *, module: bool = False) -> str:
    """What `ps` shows for a rank: `ftrun rank R/W script.py args` (`-m mod args` for a module),
    so that a person sees which rank is which and `pgrep -f script.py` still finds it."""
    where = f"{env.get('RANK', '?')}/{env.get('WORLD_SIZE', '?')}"
    return " ".join(["ftrun", "rank", where, *(["-m"] if module else []), *argv])


def set_title(title: str) -> bool:
    """Show `title` as this process's command line. Returns False where it could not (no
    /proc, an unexpected layout); the process then keeps its old command line."""
    area = _area(45)  # arg_start, arg_end: fields 48 and 49 of proc(5)
    if area is None:
        return False
    start, size = area
    if size < 2:
        return False
    text = title.encode("utf-8", "replace")[: size - 2]
    ctypes.memmove(start, text + b"\0" + b" " * (size - len(text) - 1), size)
    return True


def set_environ(environ: Mapping[bytes, bytes]) -> bool:
    """Show `environ` (normally os.environb) as this process's environment in
    /proc/PID/environ. Returns False, leaving the old block, where it does not fit, where /proc
    is not as expected, or where libc's `environ` still points into the old block."""
    area = _area(47)  # env_start, env_end: fields 50 and 51 of proc(5)
    if area is None:
        return False
    start, size = area
    block = b"".join(k + b"=" + v + b"\0" for k, v in environ.items())
    if len(block) + 1 > size or _libc_points_into(start, size):
        return False
    ctypes.memmove(start, block + b"\0" * (size - len(block)), size)
    return True


def _area(field: int) -> tuple[int, int] | None:
    """(start, size) of the memory area whose bounds are /proc/self/stat fields field+3 and
    field+4 (counted from 1), or None."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        # Fields after the command name, which may hold spaces and parentheses.
        fields = stat[stat.rindex(b")") + 2 :].split()
        start, end = int(fields[field]), int(fields[field + 1])
    except (OSError, ValueError, IndexError):
        return None
    return start, end - start


def _libc_points_into(start: int, size: int) -> bool:
    """Whether an entry of libc's `environ` array points into [start, start + size): writing
    there would change what getenv() returns. Unknown counts as yes."""
    try:
        entries = ctypes.POINTER(ctypes.c_void_p).in_dll(ctypes.CDLL(None), "environ")
    except (OSError, ValueError):
        return True
    i = 0
    while True:
        address = entries[i]
        if not address:
            return False
        if start <= address < start + size:
            return True
        i += 1
