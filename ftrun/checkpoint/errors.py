"""Checkpoint errors a user can cause, in the FtrunError hierarchy (message, hint, exit code).

A corrupt or torn checkpoint is not an error by itself: restore skips it with a warning and uses
the previous good one. These are raised only when nothing sensible is left to do; `warn` is the
line a rank prints when it goes on without something.
"""

from __future__ import annotations

import sys

from ftrun.errors import FtrunError, UsageError


def warn(message: str) -> None:
    print(f"ftrun-checkpoint: warning: {message}", file=sys.stderr, flush=True)


class CheckpointError(FtrunError):
    """A checkpoint could not be saved or restored (every candidate corrupt, a timeout, a full /dev/shm)."""


class CheckpointDirError(UsageError):
    """The checkpoint directory cannot be used (it is a file, not writable, or missing on load)."""


class StateError(UsageError):
    """The state passed to save/restore does not fit the checkpoint (keys, shapes, unsupported types)."""


class UnsafePathError(CheckpointDirError):
    """A memory-tier directory or file, or a key file, that another user made or could change:
    owned by another uid, open to group/other, or a symbolic link (ftrun/private.py)."""


class CheckpointKeyError(UsageError):
    """The checkpoint key ($FTRUN_CHECKPOINT_KEY or the key file) cannot be read or is no key."""
