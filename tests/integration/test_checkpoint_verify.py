"""Every tier is checked before restore uses it, and a tier that fails is skipped for the next:
memory, then storage newest first (docs/checkpoint.md, *Restore checks*). A real process
trains with the live snapshot on, persists every 5th step and is SIGKILLed; the test then
damages what it left, as a torn copy, a stray write or a bad disk would, and a fresh Manager
restores. What it restores must be one saved step, bit for bit, never the damaged one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ftrun.checkpoint as ckpt
from ftrun.checkpoint import storage
from tests.conftest import BIN
from tests.integration.ckpt_helpers import Managers, Toy, assert_same

STEPS, PERSIST_EVERY, WIDTH = 12, 5, 1280


@pytest.fixture
def managers(tmp_path):
    made = Managers(tmp_path)
    yield made
    made.cleanup()


def train_and_die(managers: Managers, test_id: str) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(BIN / "ckpt_verify_child.py"),
            "--job",
            managers.job,
            "--directory",
            str(managers.directory),
            "--steps",
            str(STEPS),
            "--persist-every",
            str(PERSIST_EVERY),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=BIN.parents[1],
        env={**os.environ, "FTRUN_TEST_ID": test_id, "PYTHONPATH": str(BIN.parents[1])},
    )
    assert out.returncode == -9 and f"SAVED {STEPS}" in out.stdout, out.stderr[-3000:]


def reference(tmp_path: Path, step: int) -> dict[str, torch.Tensor]:
    """The Toy after `step` steps of a run never stopped (it restores nothing first, as every
    run does: DCP makes the optimizer's state there)."""
    made = Managers(tmp_path / f"reference-{step}")
    toy = Toy(width=WIDTH)
    try:
        made(memory=False).restore(toy.state)
    finally:
        made.cleanup()
    for _ in range(step):
        toy.step()
    return toy.tensors()


def restore(managers: Managers) -> tuple[ckpt.Restored, Toy]:
    toy = Toy(width=WIDTH)
    mgr = managers(persist_every=10**9)
    mgr.restore(toy.state)
    assert mgr.restored is not None
    return mgr.restored, toy


def scribble(path: Path, offset: int = 0) -> None:
    """Overwrite 64 bytes at `offset` (the first tensor's first bytes by default)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, b"\x7f" * 64, offset)
    finally:
        os.close(fd)


def memory_files(managers: Managers) -> list[Path]:
    rank = ckpt.memory_tier_dir(managers.job) / "rank0"
    manifests = sorted(rank.glob("*.json"))
    assert any(m.name == "live.json" for m in manifests), manifests  # the live snapshot's step
    return [m.with_suffix(".data") for m in manifests]


def test_a_damaged_memory_snapshot_is_skipped_for_storage(
    managers, tmp_path, test_id, no_survivors
):
    train_and_die(managers, test_id)
    for data in memory_files(managers):  # the live file and every full copy
        scribble(data)
    got, toy = restore(managers)
    assert (got.step, got.tier) == (10, "storage")
    assert_same(toy.tensors(), reference(tmp_path, 10))
    assert any("fails its digest check" in why for why in got.skipped), got.skipped


def test_a_damaged_newest_storage_commit_falls_back_to_the_previous_one(
    managers, tmp_path, test_id, no_survivors
):
    train_and_die(managers, test_id)
    for data in memory_files(managers):
        scribble(data)
    newest = managers.directory / storage.step_dir_name(10)
    data = newest / storage.data_file_name(0)
    scribble(data, offset=data.stat().st_size // 2)  # past what a size check or a sample sees
    got, toy = restore(managers)
    assert (got.step, got.tier) == (5, "storage")
    assert_same(toy.tensors(), reference(tmp_path, 5))
    assert any(str(newest) in why for why in got.skipped), got.skipped
