"""Who may read what ftrun writes: the run and job directories, logs, events, checkpoints.

They hold training data, prompts and tracebacks, so by default only the user may read them: the
controller and every agent run with umask 077 (files 0600, directories 0700); with
`--group-readable`, umask 027 (0640, 0750) so a team's group can read the logs. The umask covers
every file a process or its ranks create; the directories ftrun itself creates are also given
their mode explicitly (`make_dir`), since mkdir's mode is filtered by whatever umask was set.
An existing run directory is left as the user made it. Ground floor: imports nothing of ftrun.
"""

from __future__ import annotations

import os
from pathlib import Path

PRIVATE_UMASK = 0o077
GROUP_UMASK = 0o027


def umask_for(group_readable: bool) -> int:
    return GROUP_UMASK if group_readable else PRIVATE_UMASK


def dir_mode(umask: int) -> int:
    """0o700 for umask 077, 0o750 for 027."""
    return 0o777 & ~umask


def make_dir(path: Path, umask: int, *, parents: bool = False, exist_ok: bool = False) -> bool:
    """mkdir with the mode `umask` allows, set explicitly on the directory we create (and on
    any parent we create); True when it was created, False when it was there already."""
    if path.is_dir():
        if not exist_ok:
            raise FileExistsError(f"{path} exists")
        return False
    missing = []
    walk = path
    while parents and not walk.parent.exists() and walk.parent != walk:
        walk = walk.parent
        missing.append(walk)
    mode = dir_mode(umask)
    try:
        path.mkdir(mode=mode, parents=parents)
    except FileExistsError:
        if not exist_ok:
            raise
        return False  # made by someone else in the meantime: theirs
    for made in (path, *missing):
        os.chmod(made, mode)
    return True
