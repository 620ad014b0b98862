"""Checkpoint configuration, resolved once: explicit argument beats FTRUN_* environment beats default.

Where things go:
- storage: `directory`, else `$FTRUN_JOB_DIR/checkpoints` (set by ftrun for every rank), else
  `./checkpoints`;
- memory tier: `memory_tier_dir(job_id)/rank<R>/` (`/dev/shm/ftrun-<uid>/<job>/rank<R>/`),
  enabled when a job id is known (`job_id=` or `$FTRUN_JOB_ID`); without one the snapshot
  buffers are anonymous memory that dies with the rank;
- the checkpoint key (auth.py): `key=`, else `$FTRUN_CHECKPOINT_KEY`, else the user's key file,
  loaded by the Manager (`with_key()`), not here: resolving a config makes no file;
- generation fences (fence.py): on when the job is known (`owner`: `job_id=` or `$FTRUN_JOB_ID`,
  memory tier or not). A plain torchrun run has no controller that relaunches around a zombie,
  and its restart count starts again at 0 on every run, so it is not fenced.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ftrun import envcontract, jobid, memtier
from ftrun.checkpoint import auth
from ftrun.checkpoint.errors import CheckpointDirError

DEFAULT_MEMORY_ROOT = memtier.ROOT
# In a job's memory tier: where a host keeps the peer copy's replicas of other hosts' ranks
# (`replica/rank<R>/`, docs/peercopy.md), beside its own ranks' `rank<R>/`.
REPLICA_DIR = "replica"
PRIORITIES = ("low", "idle", "normal")
# With persist_interval=None, a persist starts no sooner than its predecessor's duration / this
# after the predecessor started: the worker writes at most this fraction of the time.
AUTO_DUTY = 0.25
VERIFY_MODES = ("full", "size")


def memory_user_dir_name() -> str:
    """This user's private parent of every memory tier in a root: `ftrun-<uid>` (0700)."""
    return memtier.user_dir_name()


def memory_tier_dir(job_id: str, root: Path | str = DEFAULT_MEMORY_ROOT) -> Path:
    """The host-memory tier of a job: `/dev/shm/ftrun-<uid>/<job_id>`. The agent deletes it at
    job end, and sweeps those whose agent is gone (ftrun/agent/tiers.py). The per-user parent
    is 0700: no other user can plant or open anything under it (docs/security.md)."""
    if not jobid.valid(job_id):
        raise CheckpointDirError(
            f"invalid job id for the memory tier: {job_id!r}", hint=f"use {jobid.WHAT}"
        )
    return memtier.tier_dir(job_id, root)


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Everything a Manager needs to know, validated on creation."""

    directory: Path
    keep: int = 3
    job_id: str | None = None  # memory tier on iff set
    owner: str | None = None  # the job whose generations fence each other; fences on iff set
    memory_root: Path = DEFAULT_MEMORY_ROOT
    # Snapshot buffers; the memory bound is slots x state size. 3: a save never writes over the
    # newest snapshot, even while a persist reads another, so a kill loses at most one step; a
    # tier without room for the third keeps 2 (capacity.py), and a kill during a save that
    # overlaps a persist may then go back to the persisted step.
    memory_slots: int = 3
    generation: int = 0
    persist_every: int = 1  # persist saves whose step is a multiple of this
    # Seconds from the start of one persist to the start of the next; 0: whenever the worker is
    # free; None: AUTO_DUTY, the worker writes at most a quarter of the time. Writing to storage
    # is not free for training (docs/checkpoint.md, "What storage costs").
    persist_interval: float | None = None
    persist_bandwidth: float = 200.0  # MB/s the worker may write (0: unlimited); see docs
    persist_priority: str = "low"  # worker: nice 10 ("low"), SCHED_IDLE ("idle"), "normal"
    verify: str = "full"  # restore checks sizes and checksums ("full") or sizes only
    small_tensor_bytes: int = 1 << 16  # tensors up to this size are copied inside save()
    # Keep parameters and optimizer state in the memory tier's file, so that most saves copy
    # nothing (live.py); needs the memory tier (a job id). Opt-in: it cannot see every change
    # made outside the optimizer step, and a rank killed inside one restores the last full
    # copy (docs/checkpoint.md, *Live snapshot*). False: every save is a full copy.
    live_snapshot: bool = False
    # Under a live snapshot, saves between full copies into a slot (the restore's fallback when
    # a rank dies inside an optimizer step); None: as often as 2 % of the training time pays.
    full_copy_every: int | None = None
    snapshot_timeout: float = 600.0  # seconds wait_snapshot() may block
    persist_timeout: float = 900.0  # seconds a persist (all ranks' parts + commit) may take
    collective_timeout: float = 900.0  # seconds for the checkpoint process group's collectives
    # Under ftrun: a file that appears when the job gets a preemption notice; the save after
    # it is persisted at once, whatever persist_every says (docs/slurm.md).
    preempt_file: Path | None = None
    # HMAC key for every pickle and manifest (auth.py); None: with_key() loads the rank's own.
    key: bytes | None = field(default=None, repr=False)
    # Restore no step at or after this one: the controller rejected its restore (the job failed
    # the same way twice right after restoring it; restore.py). Under ftrun: FTRUN_RESTORE_BEFORE.
    restore_before: int | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.key is not None and (not isinstance(self.key, bytes) or len(self.key) < 16):
            problems.append("key must be bytes, at least 16 of them (e.g. bytes.fromhex(...))")
        if self.keep < 1:
            problems.append(f"keep must be >= 1 (got {self.keep})")
        if self.memory_slots not in (2, 3):
            problems.append(f"memory_slots must be 2 or 3 (got {self.memory_slots})")
        if self.full_copy_every is not None and self.full_copy_every < 1:
            problems.append(f"full_copy_every must be >= 1 (got {self.full_copy_every})")
        if self.persist_every < 1:
            problems.append(f"persist_every must be >= 1 (got {self.persist_every})")
        if self.persist_interval is not None and self.persist_interval < 0:
            problems.append(f"persist_interval must be >= 0 (got {self.persist_interval})")
        if self.persist_bandwidth < 0:
            problems.append(f"persist_bandwidth must be >= 0 (got {self.persist_bandwidth})")
        if self.persist_priority not in PRIORITIES:
            problems.append(f"persist_priority must be one of {PRIORITIES}")
        if self.verify not in VERIFY_MODES:
            problems.append(f"verify must be one of {VERIFY_MODES}")
        for name in ("snapshot_timeout", "persist_timeout", "collective_timeout"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be > 0")
        if self.job_id is not None:
            memory_tier_dir(self.job_id, self.memory_root)  # validates the id
        if problems:
            raise CheckpointDirError(
                "invalid checkpoint options: " + "; ".join(problems),
                hint="see docs/checkpoint.md for the options",
            )

    @property
    def memory_dir(self) -> Path | None:
        return memory_tier_dir(self.job_id, self.memory_root) if self.job_id else None

    def with_key(self, environ: Mapping[str, str] | None = None) -> CheckpointConfig:
        """This config with its key: the one given, else $FTRUN_CHECKPOINT_KEY, else the user's
        key file (made on first use)."""
        if self.key is not None:
            return self
        return replace(self, key=auth.load_key(environ))

    @property
    def hmac_key(self) -> bytes:
        """The key, once with_key() has run (the Manager's config always has one)."""
        if self.key is None:
            raise RuntimeError("CheckpointConfig.with_key() has not run")
        return self.key


def resolve_config(
    directory: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    memory: bool | None = None,
    job_id: str | None = None,
    **options: Any,
) -> CheckpointConfig:
    """Build the config from arguments and the FTRUN_* environment (read here, once).

    `options` are CheckpointConfig fields, checked by its __post_init__."""
    env = os.environ if environ is None else environ
    owner = options.pop("owner", None) or job_id or env.get(envcontract.JOB_ID) or None
    if directory is not None:
        chosen = Path(directory)
    elif env.get(envcontract.JOB_DIR):
        chosen = Path(env[envcontract.JOB_DIR]) / "checkpoints"
    else:
        chosen = Path("checkpoints")
    if memory is False:
        job = None
    else:
        job = job_id or env.get(envcontract.JOB_ID) or None
        if memory is True and job is None:
            raise CheckpointDirError(
                "the memory tier needs a job id", hint="run under `ftrun launch` or pass job_id=..."
            )
    flag = env.get(envcontract.PREEMPT_FILE)
    before = env.get(envcontract.RESTORE_BEFORE, "")
    return CheckpointConfig(
        directory=chosen.absolute(),
        job_id=job,
        owner=owner,
        **{
            "generation": _generation(env),
            "preempt_file": Path(flag) if flag else None,
            "restore_before": int(before) if before.isdigit() else None,
            **options,
        },
    )


def _generation(env: Mapping[str, str]) -> int:
    """Which run of the job this is: ftrun's generation, else torchrun's restart count (plain
    `torchrun --max-restarts`), else 0. Memory snapshots are matched on (step, generation)."""
    for name in (envcontract.GENERATION, "TORCHELASTIC_RESTART_COUNT"):
        try:
            return int(env[name])
        except (KeyError, ValueError):
            continue
    return 0
