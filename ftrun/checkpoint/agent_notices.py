"""What a rank's checkpoints tell the agent, besides the restore line (restore.py).

- Its stall so far (rank 0): what checkpoints cost the training loop, goodput's bucket; at most
  every STALL_REPORT_INTERVAL_S, since each datagram wakes the agent.
- A preemption notice's save committed to storage: the job is about to be stopped and requeued,
  and the controller stops it knowing what was kept.
- A wait with no training steps in it (close()'s last persist, wait_persist()), declared as a
  section, so that the agent's hang detection does not read it as a hang.

All through `ftrun.runtime`, the rank's one channel to the agent: no message kind of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from ftrun import runtime
from ftrun.checkpoint.restore import warn
from ftrun.checkpoint.stats import Stats

SECTION_SLACK_S = 60.0
# Rank 0 tells the agent its checkpoint stall so far at most this often: each datagram wakes
# the agent, which on a busy host costs the sender ~0.5 ms (the agent forwards it every 0.5 s).
STALL_REPORT_INTERVAL_S = 0.25


class StallReport:
    """Rank 0's checkpoint stall so far (save() and the waits for a copy), to the agent."""

    def __init__(self, stats: Stats) -> None:
        self._stats = stats
        self._reported_at = 0.0

    def __call__(self, *, final: bool = False) -> None:
        now = time.monotonic()
        if final or now - self._reported_at >= STALL_REPORT_INTERVAL_S:
            self._reported_at = now
            runtime.checkpoint_stall(self._stats.save_s + self._stats.blocked_s)


class Preemption:
    """A preemption notice: the file `flag` (config.preempt_file) exists. Answered once."""

    def __init__(self, flag: Path | None, *, rank: int) -> None:
        self._flag, self._rank = flag, rank
        self._pending = flag is not None

    def noticed(self) -> bool:
        """Whether this rank sees a notice not answered yet (the ranks agree on it: persister.py)."""
        return self._pending and self._flag is not None and self._flag.exists()

    def answer(
        self, step: int, *, persisted: bool, wait_persist: Callable[[], bool], stats: Stats
    ) -> None:
        """Wait until the save of `step` is committed to storage, then tell the agent (rank 0),
        so the controller stops the job knowing what was kept. Training goes on until it is
        stopped."""
        self._pending = False
        if not persisted:
            warn(f"step {step} is not persisted for the preemption: the worker is gone or busy")
            return
        done = wait_persist()
        if self._rank == 0 and done and stats.last_persisted_step == step:
            runtime.checkpoint_committed(step, preempt=True)


def no_steps(name: str, limit: float) -> AbstractContextManager[None]:
    """A wait with no steps in it, declared to the agent (ftrun.section): the last persist at
    close() takes seconds, and with 0.3 s GPU steps the hang allowance after the last step is the
    2 s floor, so undeclared it read as a hang and the finished job was restarted. The section's
    allowance is the wait's own limit, plus time for the collective in persist_last."""
    return runtime.section(name, timeout_s=limit + SECTION_SLACK_S)
