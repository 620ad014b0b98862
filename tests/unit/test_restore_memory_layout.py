"""Which memory snapshots a restore may combine, with the ranks' memory tiers built by hand in the
real /dev/shm and every rank's restore() run on a thread of its own (an in-process all_gather).

"A restore names a step and is exactly that step, or it is not used": a rank's per-rank state
(PerRank entries, RNG) of a step is only in the snapshot that rank wrote. The case that broke
it (a restart in place under CPU load): rank 1 was killed during step 7 while its snapshot of
step 6 was still copying (no manifest), and rank 0's third slot was pinned by a persist of step 1,
so its saves rotated through two slots: rank 0 held 1, 6 and 7, rank 1 held 4 and 5. No step was
in every rank's own tier, and the host-wide (resharded) restore took step 7 from rank 0's
snapshot for both, with rank 1's per-rank state left as it started."""

from __future__ import annotations

import shutil
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from ftrun import private
from ftrun.checkpoint import restore, slots, state
from ftrun.checkpoint.config import CheckpointConfig, memory_tier_dir

KEY = bytes(range(32))
TORN = -1  # a slot whose copy was cut short: data written, no manifest
INITIAL = -7.0  # a fresh rank's values, before any restore


class ThreadComm:
    """Comm's collectives for ranks that are threads of one process; every wait is bounded."""

    def __init__(self, rank: int, world: int, box: list[Any], barrier: threading.Barrier):
        self.rank, self.world = rank, world
        self._box, self._barrier = box, barrier

    def all_gather(self, obj: Any) -> list[Any]:
        self._box[self.rank] = obj
        self._barrier.wait(timeout=30)
        out = list(self._box)
        self._barrier.wait(timeout=30)
        return out

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return self.all_gather(obj)[src]


def comms(world: int) -> list[ThreadComm]:
    box: list[Any] = [None] * world
    barrier = threading.Barrier(world)
    return [ThreadComm(r, world, box, barrier) for r in range(world)]


def rank_state(value: float, *, stages: int = 1) -> dict[str, Any]:
    """Shared tensors (one per stage the rank holds) and a per-rank tensor and value, all
    `value` (fresh: INITIAL)."""
    return {
        "train": {f"stage{i}": torch.full((4,), value) for i in range(stages)},
        "data": state.PerRank({"noise": torch.full((3,), value), "position": value}),
    }


def of(step: int, rank: int) -> float:
    """Rank `rank`'s per-rank values at `step` (the shared tensor holds `step`)."""
    return step * 10.0 + rank


@pytest.fixture
def job() -> Iterator[Path]:
    path = memory_tier_dir(f"test-restore-{uuid.uuid4().hex[:10]}")
    private.make_dirs(path.parent)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def build(job: Path, rank: int, world: int, steps: list[int], *, stages: int = 1) -> None:
    """Rank `rank` of `world` (generation 1) holds the snapshots of `steps`, one per slot."""
    tier = slots.MemoryTier(
        directory=job / f"rank{rank}", slots=3, rank=rank, world_size=world, key=KEY
    )
    try:
        for index, step in enumerate(steps):
            values = rank_state(float(step), stages=stages)
            values["data"] = state.PerRank(
                {"noise": torch.full((3,), of(step, rank)), "position": of(step, rank)}
            )
            flat = state.flatten(values, rng=False)
            keyed = state.keyed_tensors(flat, rank)
            entries, size = slots.layout(keyed)
            slot = tier.slots[index]
            slot.ensure(size)
            for (_, tensor), entry in zip(keyed, entries, strict=True):
                slot.view(entry).copy_(tensor)
            if step == TORN:
                continue  # the copy never finished: no manifest was written
            tier.commit(
                index,
                step=step,
                generation=1,
                sig=slots.signature(entries, world),
                entries=entries,
                objects=state.pickle_objects(flat, key=KEY),
                data_size=size,
            )
    finally:
        tier.close()


def restore_all(
    job: Path, tmp_path: Path, world: int
) -> list[tuple[restore.Restored, dict[str, Any]]]:
    """Every rank of `world` restores at once; returns what each restored and its state."""

    def one(comm: ThreadComm) -> tuple[restore.Restored, dict[str, Any]]:
        values = rank_state(INITIAL)
        flat = state.flatten(values, rng=False)
        tier = slots.MemoryTier(
            directory=job / f"rank{comm.rank}", slots=3, rank=comm.rank, world_size=world, key=KEY
        )
        config = CheckpointConfig(directory=tmp_path / "storage", job_id=job.name, key=KEY)
        try:
            restored, objects, _ = restore.restore(flat, comm=comm, tier=tier, config=config)  # type: ignore[arg-type]
        finally:
            tier.close()
        state.apply(flat, objects)
        return restored, values

    with ThreadPoolExecutor(world) as pool:
        futures = [pool.submit(one, comm) for comm in comms(world)]
        return [f.result(timeout=60) for f in futures]


def held(values: dict[str, Any]) -> tuple[float, float, Any]:
    """(shared tensor, per-rank tensor, per-rank value) of a restored state."""
    data = values["data"].value
    return values["train"]["stage0"][0].item(), data["noise"][0].item(), data["position"]


def test_no_step_in_every_ranks_own_tier_is_not_made_up_from_another_ranks_snapshot(
    job, tmp_path, capfd
):
    """The case above: no step is restored from memory (storage holds none: step 0), where
    before both ranks restored "step 7" and rank 1's per-rank state was its initial one."""
    build(job, 0, 2, [1, 6, 7])
    build(job, 1, 2, [4, 5, TORN])
    results = restore_all(job, tmp_path, 2)
    for rank, (restored, values) in enumerate(results):
        assert (restored.step, restored.tier) == (0, "none"), (rank, restored)
        assert held(values) == (INITIAL, INITIAL, INITIAL)
    skipped = results[0][0].skipped
    assert any("step 7 is not used: rank(s) 1 hold no snapshot of their own" in s for s in skipped)
    assert any("step 5 is not used: rank(s) 0 hold no snapshot" in s for s in skipped)
    assert "another layout" not in capfd.readouterr().err


def test_the_newest_step_every_rank_holds_is_restored_whole_beside_a_torn_one(job, tmp_path):
    build(job, 0, 2, [5, 6, 7])
    build(job, 1, 2, [5, 6, TORN])
    for rank, (restored, values) in enumerate(restore_all(job, tmp_path, 2)):
        assert (restored.step, restored.tier) == (6, "memory")
        assert held(values) == (6.0, of(6, rank), of(6, rank))


def test_a_grow_restores_the_shared_state_and_says_whose_per_rank_state_starts_fresh(
    job, tmp_path, capfd
):
    """2 ranks saved step 7 (rank 1's copy of 8 torn); 3 ranks restore: another layout, so the
    shared tensors come from memory and every rank's per-rank state starts fresh, by name."""
    build(job, 0, 2, [6, 7])
    build(job, 1, 2, [6, 7, TORN])
    for restored, values in restore_all(job, tmp_path, 3):
        assert (restored.step, restored.tier) == (7, "memory")
        assert held(values) == (7.0, INITIAL, INITIAL)
    err = capfd.readouterr().err
    assert "saved in another layout (2 ranks, now 2)" not in err
    assert (
        "step 7 is restored from host memory saved in another layout (2 ranks, now 3); "
        "per-rank state (RNG, PerRank entries) of rank(s) 0-2 is not restored: it starts fresh"
    ) in err


def test_a_new_plan_on_as_many_ranks_keeps_the_per_rank_state_of_ranks_that_have_it(
    job, tmp_path, capfd
):
    """The same world size, another layout (each rank held two stages, now one: a new plan):
    rank 0's own old snapshot holds its per-rank entries and they are restored; rank 1's copy
    of step 7 is torn, so its per-rank state starts fresh, and the warning says so."""
    build(job, 0, 2, [6, 7], stages=2)
    build(job, 1, 2, [6, TORN], stages=2)
    results = restore_all(job, tmp_path, 2)
    assert [r.step for r, _ in results] == [7, 7]
    assert held(results[0][1]) == (7.0, of(7, 0), of(7, 0))
    assert held(results[1][1]) == (7.0, INITIAL, INITIAL)
    assert (
        "saved in another layout (2 ranks, now 2); per-rank state (RNG, PerRank entries) of "
        "rank(s) 1 is not restored: it starts fresh"
    ) in capfd.readouterr().err
