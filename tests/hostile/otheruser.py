"""Another user of the host, for real: commands run as `nobody` (setpriv drops to uid 65534 with
no groups), in a shared directory both can reach, the way /tmp is shared.

`shared_tree()` makes a world-traversable temporary directory (under the system temp dir: a
pytest tmp_path is 0700 and nobody could not reach into it) and removes it, with whatever
`nobody` left in it, at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

OTHER_UID = 65534
AS_OTHER = ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups"]


def need_root() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("acting as another user needs root and setpriv")


def as_other(script: str, *, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
    """Run `sh -c script` as nobody; fails the test if it fails."""
    done = subprocess.run(
        [*AS_OTHER, "/bin/sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, f"as nobody: {script!r}: {done.stderr}"
    return done


def attempt_as_other(script: str, *, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
    """Run `sh -c script` as nobody and return, whether it worked or not."""
    return subprocess.run(
        [*AS_OTHER, "/bin/sh", "-c", script], capture_output=True, text=True, timeout=timeout_s
    )


@contextlib.contextmanager
def shared_tree() -> Iterator[Path]:
    """A directory every user can enter (0755), removed at the end with all in it."""
    need_root()
    # In the system's /tmp, not $TMPDIR: under pytest-xdist that is a worker's own 0700
    # directory (tests/conftest.py), which nobody could not even enter.
    root = Path(tempfile.mkdtemp(prefix="ftrun-shared-", dir="/tmp"))
    try:
        os.chmod(root, 0o755)
        yield root
    finally:
        shutil.rmtree(root)


def sticky_dir(parent: Path, name: str = "tmp") -> Path:
    """A /tmp of our own: root's, 1777."""
    path = parent / name
    path.mkdir()
    os.chmod(path, 0o1777)
    return path
