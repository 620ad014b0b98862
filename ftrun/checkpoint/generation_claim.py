"""This rank's generation's claim on what it writes: the memory tier and the storage directory.

Before a Manager reads either directory it claims both for its generation (fence.py): from then
on a rank of an older generation, a zombie of a lost host training on, can publish nothing
there. The storage directory's fence is checked again by the persist worker at each commit
(worker.py); the memory tier's is held here, for the life of the Manager, and acquired around
every write into the tier (a slot's copy until its manifest is written, the live file's commit,
its adoption), so a newer generation cannot claim the tier while this rank writes into it.

Without a persistent memory tier, or outside ftrun (no owner), there is no tier fence and
acquire()/release() do nothing. With one, the rank directories an older generation left on this
host (stale_ranks.py) are set aside at the first save after this rank's first persist, and
deleted on a thread.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from ftrun.checkpoint import capacity, stale_ranks
from ftrun.checkpoint.config import CheckpointConfig
from ftrun.checkpoint.fence import FENCE_TIMEOUT_S, GenerationFence
from ftrun.checkpoint.restore import warn
from ftrun.checkpoint.slots import MemoryTier


class GenerationClaim:
    """The memory tier's fence (None: no tier fence), and the stale rank directories to remove."""

    def __init__(self, fence: GenerationFence | None, *, memory_dir: Path | None) -> None:
        self.fence = fence
        self._memory_dir = memory_dir
        self._stale_ranks_pending = fence is not None and memory_dir is not None
        self._stale_ranks_removal: threading.Thread | None = None

    @classmethod
    def open(
        cls, config: CheckpointConfig, *, rank: int, world: int
    ) -> tuple[MemoryTier, GenerationClaim]:
        """This rank's memory tier (capacity.open_tier) and its claim on both directories. Without
        room for the fence's file there is no tier (capacity.leave_tier). On failure the tier is
        closed before the error is raised."""
        tier = capacity.open_tier(config, rank=rank, world=world)
        mem = config.memory_dir if tier.persistent else None
        owner = config.owner
        fence: GenerationFence | None = None
        try:
            try:
                fence = _advance(mem, owner, config.generation) if mem and owner else None
            except OSError as exc:  # no room for the fence's file: no tier (capacity.py)
                tier = capacity.leave_tier(tier, config, exc, world=world)
            if owner:
                _advance(config.directory, owner, config.generation).close()
            if fence is not None and tier.directory is not None:
                try:
                    stale_ranks.claim_rank_dir(tier.directory, fence.mine)
                except OSError as exc:  # only costs memory: the agent removes it at job end
                    warn(f"the memory tier directory {tier.directory} is not claimed: {exc}")
        except BaseException:
            tier.close()
            if fence is not None:
                fence.close()
            raise
        return tier, cls(fence, memory_dir=config.memory_dir)

    def acquire(self) -> None:
        """Hold the tier until release(): raises Superseded when a newer generation claimed it."""
        if self.fence is not None:
            self.fence.acquire()

    def release(self) -> None:
        if self.fence is not None:
            self.fence.release()

    def remove_stale_ranks(self, world: int) -> int:
        """Holding the tier (acquire()): set aside, once, the rank directories of older
        generations, and delete them on a thread; returns how many were set aside."""
        if not self._stale_ranks_pending:
            return 0
        assert self.fence is not None and self._memory_dir is not None
        self._stale_ranks_pending = False
        moved = stale_ranks.set_aside(self._memory_dir, self.fence.mine, world)
        self._stale_ranks_removal = stale_ranks.remove_later(moved)
        return len(moved)

    def close(self, *, timeout: float) -> None:
        """Wait (up to `timeout`) for the stale directories' removal, then give the fence up."""
        if self._stale_ranks_removal is not None:
            self._stale_ranks_removal.join(timeout=timeout)
        if self.fence is not None:
            self.fence.close()


def _advance(directory: os.PathLike[str], owner: str, generation: int) -> GenerationFence:
    """Claim `directory` for this generation (fence.py); the fence is open on return."""
    fence = GenerationFence(
        Path(directory), job=owner, generation=generation, timeout_s=FENCE_TIMEOUT_S
    )
    try:
        fence.advance()
    except BaseException:
        fence.close()
        raise
    return fence
