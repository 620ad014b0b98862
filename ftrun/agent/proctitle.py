"""Give a forked process its own command line, as `ps`, `htop` and `pkill -f` read it.

A warm-started rank is a fork of the zygote, so the kernel still shows the zygote's argv for it;
a user who runs `pkill -f train.py` or looks for their script in `htop` must find the rank. The
kernel reads /proc/PID/cmdline from the argv area of the process's own memory (arg_start to
arg_end in /proc/PID/stat), so we write the new title there, as setproctitle(3) does.

Two details keep this honest:
- Room: the argv area cannot grow, so the agent starts the zygote with a padding argument
  (`title_room()`); every fork inherits that area and a title up to its size fits.
- The environment block that follows argv is left alone (the setproctitle package moves it to
  make room): ftrun finds its processes by FTRUN_AGENT_ID in /proc/PID/environ.

The area is filled with the title, a NUL, then spaces up to its last byte. A non-NUL last byte is
the kernel's sign that the title was rewritten (fs/proc/base.c, get_mm_cmdline): it then returns
the text up to the first NUL, which `ps` shows and psutil splits on spaces into arguments.
"""

from __future__ import annotations

import ctypes

ROOM_BYTES = 4096


def title_room() -> str:
    """An argument for the zygote's command line that reserves room for its forks' titles."""
    return " " * (ROOM_BYTES - 1)


def set_title(title: str) -> bool:
    """Show `title` as this process's command line. Returns False where it could not (no
    /proc, an unexpected layout); the process then keeps its old command line."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        # Fields after the command name, which may hold spaces and parentheses.
        fields = stat[stat.rindex(b")") + 2 :].split()
        arg_start, arg_end = int(fields[45]), int(fields[46])  # fields 48 and 49 of proc(5)
    except (OSError, ValueError, IndexError):
        return False
    size = arg_end - arg_start
    if size < 2:
        return False
    text = title.encode("utf-8", "replace")[: size - 2]
    area = text + b"\0" + b" " * (size - len(text) - 1)
    ctypes.memmove(arg_start, area, size)
    return True
