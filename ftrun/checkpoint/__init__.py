"""ftrun.checkpoint: fast, atomic, reshardable checkpoints for training ranks.

    import ftrun.checkpoint as ckpt

    mgr = ckpt.Manager()                              # $FTRUN_JOB_DIR/checkpoints or ./checkpoints
    state = {"train": ckpt.TrainState(model, optimizer), "data": ckpt.PerRank(loader)}
    start = mgr.restore(state)                        # step restored, 0 if none
    for step in range(start + 1, steps + 1):
        ...
        optimizer.step()                              # waits for the previous snapshot's copy
        mgr.save(step, state)                         # milliseconds: the copy runs in the background
    mgr.close()                                       # persists the last snapshot

Runs inside ranks; imports neither the CLI nor the controller. Importing it does no work: names
load on first use (the persist worker imports `ftrun.checkpoint.worker` without torch).
See docs/checkpoint.md for the design and the memory bound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ftrun.checkpoint.config import CheckpointConfig, memory_tier_dir
    from ftrun.checkpoint.errors import (
        CheckpointDirError,
        CheckpointError,
        CheckpointKeyError,
        StateError,
        UnsafePathError,
    )
    from ftrun.checkpoint.fence import Superseded
    from ftrun.checkpoint.manager import Manager
    from ftrun.checkpoint.restore import Restored
    from ftrun.checkpoint.state import PerRank, TrainState
    from ftrun.checkpoint.stats import Stats

__all__ = [
    "Manager",
    "TrainState",
    "PerRank",
    "Restored",
    "Stats",
    "CheckpointConfig",
    "memory_tier_dir",
    "CheckpointError",
    "CheckpointDirError",
    "StateError",
    "UnsafePathError",
    "CheckpointKeyError",
    "Superseded",
]

_HOME = {
    "Manager": "manager",
    "Stats": "stats",
    "TrainState": "state",
    "PerRank": "state",
    "Restored": "restore",
    "CheckpointConfig": "config",
    "memory_tier_dir": "config",
    "CheckpointError": "errors",
    "CheckpointDirError": "errors",
    "StateError": "errors",
    "UnsafePathError": "errors",
    "CheckpointKeyError": "errors",
    "Superseded": "fence",
}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'ftrun.checkpoint' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"ftrun.checkpoint.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
