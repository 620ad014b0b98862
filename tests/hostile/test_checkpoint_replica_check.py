"""The memory tier's check at restore (ftrun/checkpoint/sample_digest.py) against damaged
snapshots and replicas in the real /dev/shm: a replica torn or overwritten under its manifest is
not used, and a damaged snapshot of this rank gives way to a peer's replica of the same step."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ftrun.checkpoint import state
from tests.hostile.test_checkpoint_memory_tier import restore_from, saved_snapshot, shm  # noqa: F401


def scribble(path: Path) -> None:
    """What a torn copy or a stray write leaves: other bytes where the first tensor starts."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, b"\x7f" * 16, 0)
    finally:
        os.close(fd)


def test_a_damaged_replica_is_not_used(shm, tmp_path, capfd):  # noqa: F811
    saved_snapshot(shm, world_size=2, where="replica/rank1")
    scribble(shm / "replica" / "rank1" / "slot0.data")
    flat = state.flatten({"m": {"w": torch.zeros(4)}, "x": {"epoch": 0}})
    assert restore_from(shm, flat, tmp_path).tier == "none"
    assert torch.equal(flat.tensors[0].tensor, torch.zeros(4))
    assert "fails its digest check" in capfd.readouterr().err


def test_a_damaged_snapshot_gives_way_to_a_replica_of_the_same_step(shm, tmp_path, capfd):  # noqa: F811
    """This rank's own snapshot of step 3 is damaged; rank 1's replica of step 3 (another host's
    rank, 2 ranks then) is here too: the restore takes the replica's tensors, step 3, exact."""
    saved_snapshot(shm)
    saved_snapshot(shm, world_size=2, where="replica/rank1")
    scribble(shm / "rank0" / "slot0.data")
    flat = state.flatten({"m": {"w": torch.zeros(4)}, "x": {"epoch": 0}})
    restored = restore_from(shm, flat, tmp_path)
    assert (restored.step, restored.tier) == (3, "memory")
    assert "replica" in str(restored.path)
    assert torch.equal(flat.tensors[0].tensor, torch.arange(4.0))
    assert "fails its digest check" in capfd.readouterr().err
