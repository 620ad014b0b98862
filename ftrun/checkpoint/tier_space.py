"""Room in the memory tier: how much there is, and which errors mean it ran out.

Running out is never fatal: it steps the tier down (capacity.py), so every place that writes
into the tier asks `is_full()` of what it caught; the messages say how much was free (`space`).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.ENOMEM, errno.EIO, errno.EFBIG})


def is_full(exc: BaseException | None) -> bool:
    """Whether `exc` (or what caused it) is the tier running out of space or failing to write:
    what steps the tier down, never a failed job."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:,.0f} MiB"


def space(path: Path) -> str:
    """`/dev/shm: 120 MiB free of 512 MiB`, for the messages of a tier that does not fit."""
    try:
        st = os.statvfs(path)
    except OSError:
        return f"{path}: size unknown"
    return f"{path}: {mib(st.f_bavail * st.f_frsize)} free of {mib(st.f_blocks * st.f_frsize)}"
