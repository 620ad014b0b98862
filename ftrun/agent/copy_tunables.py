"""Large copies in the ranks use non-temporal stores: glibc's threshold, lowered where it is high.

A snapshot every step copies the whole training state, tensor by tensor (in chunks of at most
64 MiB, `ftrun.checkpoint.snapshot.COPY_CHUNK`), and the optimizer step waits for what the
background thread has not copied yet. glibc's `memcpy` switches from ordinary stores (each
destination line read for ownership, then written back) to non-temporal ones at
`glibc.cpu.x86_non_temporal_threshold`, which it derives from the L3 size the CPU reports: about
1 MiB on an ordinary server with glibc 2.36, a quarter of the L3 from 2.38 on. Some VMs report a
huge L3 (this project's test VM: 480 MiB, threshold 181 MiB), and there every tensor's copy went
through the cache: 10 GB/s for two threads into /dev/shm against 17-18 GB/s with non-temporal
stores, for any copy of 1 MiB or more. With a snapshot every step the optimizer step was held
77 ms instead of 45 ms for a 0.94 GiB state (docs/checkpoint.md, Measurements).

So the agent lowers the threshold to 4 MiB in the environment every rank inherits, where glibc
picked a higher one: never raised, never over a value the user set (set the tunable yourself to
keep glibc's). A snapshot's destination is not read again by the rank, so streaming it is right
at any size; what else changes is the rank's own copies of 4 MiB or more, which then leave the
caches to the training's working set instead of filling them. 4 MiB and not lower: a smaller
copy may still be read back from a core's cache by the code that made it. The value is read at
process start (by ld.so), so it has to be in the environment the interpreter starts with.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from collections.abc import MutableMapping

TUNABLE = "glibc.cpu.x86_non_temporal_threshold"
THRESHOLD = 4 << 20  # copies of this size or more stream
_LOADERS = ("ld.so", "/lib64/ld-linux-x86-64.so.2")
_LINE = re.compile(re.escape(TUNABLE) + r":\s*(0x[0-9a-fA-F]+|\d+)")


def glibc_threshold() -> int | None:
    """glibc's non-temporal threshold on this host (`ld.so --list-tunables`, glibc >= 2.33), or
    None where it cannot be read: another libc, an older glibc, another architecture."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    for loader in _LOADERS:
        path = shutil.which(loader)
        if path is None:
            continue
        try:
            out = subprocess.run(
                [path, "--list-tunables"], capture_output=True, text=True, timeout=5, check=False
            ).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        if match := _LINE.search(out):
            return int(match.group(1), 0)
    return None


def tunables_for_ranks(current_env: str | None, threshold: int | None) -> str | None:
    """The GLIBC_TUNABLES value ranks should start with, or None to leave it as it is.

    `current_env` is GLIBC_TUNABLES as forwarded (colon-separated name=value items),
    `threshold` what glibc picks here (glibc_threshold())."""
    items = [item for item in (current_env or "").split(":") if item]
    if any(item.split("=", 1)[0] == TUNABLE for item in items):
        return None  # the user's choice
    if threshold is None or threshold <= THRESHOLD:
        return None  # such copies already stream here, or we cannot tell
    return ":".join([*items, f"{TUNABLE}={THRESHOLD:#x}"])


def apply(env: MutableMapping[str, str]) -> str | None:
    """Lower the threshold in `env` (the agent's own environment, which the zygote, torchrun and
    the ranks inherit) where tunables_for_ranks says so; returns the new value, or None."""
    value = tunables_for_ranks(env.get("GLIBC_TUNABLES"), glibc_threshold())
    if value is not None:
        env["GLIBC_TUNABLES"] = value
    return value
