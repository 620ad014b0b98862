"""The counters a checkpoint Manager keeps, for benchmarks and logs.

Their own module so that the Manager (saves, time blocked) and the Persister (persists started,
finished, failed) both write them without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Stats:
    """Counters for benchmarks and logs (seconds are wall time in the training thread)."""

    saves: int = 0
    live_saves: int = 0  # saves that copied only what the live snapshot does not keep (live.py)
    save_s: float = 0.0  # inside save()
    blocked_s: float = 0.0  # inside wait_snapshot() (optimizer pre-step hook, next save)
    host_wait_s: float = 0.0  # save() held back for the host's other ranks (host_progress.py)
    persists: int = 0  # persists started
    persisted: int = 0  # persists this rank finished (rank 0: committed)
    persist_failures: int = 0
    votes: int = 0  # collectives that decided whether to persist (not one per save: persister.py)
    last_persisted_step: int | None = None
    last_persist_s: float | None = None  # wall time of the last persist, save() to done
    stale_ranks_removed: int = 0  # directories no rank of this generation uses (stale_ranks.py)
