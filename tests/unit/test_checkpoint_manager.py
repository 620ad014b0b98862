"""ftrun.checkpoint.Manager in one process, with its real persist worker: round trips through
each tier, exact resume, tier choice, corrupt checkpoints, pruning, errors, the restore report."""

from __future__ import annotations

import os
import shutil
import signal
import time

import pytest
import torch

import ftrun.checkpoint as ckpt
from ftrun.checkpoint import host_progress, storage
from ftrun.checkpoint.config import AUTO_DUTY
from tests.conftest import wait_for
from tests.integration.ckpt_helpers import Managers, Toy, assert_same


@pytest.fixture
def managers(tmp_path):
    made = Managers(tmp_path)
    yield made
    made.cleanup()


def train(toy: Toy, mgr: ckpt.Manager, steps: range, *, persist_each: bool = False) -> list[float]:
    losses = []
    for step in steps:
        losses.append(toy.step())
        mgr.save(step, toy.state)
        if persist_each:
            assert mgr.wait_persist(30)
    return losses


@pytest.mark.parametrize("memory", [False, True], ids=["storage", "memory"])
def test_resume_is_exact_from_either_tier(managers, memory):
    """Restore into fresh objects, train on: the same losses, bit for bit, as never stopping."""
    toy = Toy(seed=0)
    mgr = managers(memory=memory)
    assert mgr.restore(toy.state) == 0 and mgr.restored.tier == "none"
    train(toy, mgr, range(1, 5))
    mgr.close()  # persists step 4
    saved = toy.tensors()
    reference = [toy.step() for _ in range(4)]  # the run that never stopped

    fresh = Toy(seed=123)  # other weights, other RNG position
    mgr2 = managers(memory=memory)
    assert mgr2.restore(fresh.state) == 4
    assert mgr2.restored.tier == ("memory" if memory else "storage")
    assert_same(fresh.tensors(), saved)
    assert (fresh.loader.position, fresh.extra) == (4, {"epoch": 4, "note": "n"})
    assert [fresh.step() for _ in range(4)] == reference


def test_snapshot_holds_the_values_of_its_step(managers):
    """The optimizer step right after save() waits for the copy (pre-step hook)."""
    toy = Toy(width=256)  # 256 KiB weights: copied in the background, not inside save()
    mgr = managers(memory=False)
    mgr.restore(toy.state)
    toy.step()
    mgr.save(1, toy.state)
    at_save = toy.tensors()
    toy.step()  # changes every parameter, immediately
    mgr.close(persist_last=False)
    mgr2 = managers(memory=False)
    fresh = Toy(seed=5, width=256)
    # Nothing was persisted but step 1 (the first save always is): it must be step 1's values.
    assert mgr2.restore(fresh.state) == 1
    assert_same(fresh.tensors(), at_save)


def test_a_persist_starts_at_most_once_per_interval(managers):
    """persist_interval spaces the persists by the clock; every save still reaches memory, and
    close() persists the last one whatever the clock says."""
    toy = Toy()
    mgr = managers(persist_interval=3600)
    mgr.restore(toy.state)
    train(toy, mgr, range(1, 6), persist_each=True)  # the worker is idle at every save
    assert (mgr.stats.saves, mgr.stats.persists, mgr.stats.last_persisted_step) == (5, 1, 1)
    mgr.close()
    assert mgr.stats.last_persisted_step == 5
    assert [p.name for p in sorted(managers.directory.glob("step-*"))] == [
        "step-0000000001",
        "step-0000000005",
    ]


def test_the_next_persist_starts_once_the_interval_has_passed(managers):
    toy = Toy()
    mgr = managers(persist_interval=0.5)
    mgr.restore(toy.state)
    started = time.monotonic()
    train(toy, mgr, range(1, 2), persist_each=True)
    step = 1
    persisted_at: list[float] = []

    def second_persist() -> bool:
        nonlocal step
        step += 1
        train(toy, mgr, range(step, step + 1))
        if mgr.stats.persists == 2:
            persisted_at.append(time.monotonic())
            return True
        return False

    wait_for(second_persist, 30, "a second persist")
    assert persisted_at[0] - started >= 0.5
    assert mgr.wait_persist(30) and mgr.stats.last_persisted_step == step
    assert step > 2  # the saves in between were not persisted


def test_by_default_the_worker_writes_at_most_a_quarter_of_the_time(managers):
    """persist_interval=None: the next persist starts no sooner than 4x the last one's duration
    after it started. The persist is slowed to make its duration measurable: 256 KiB of
    weights at 1 MB/s."""
    toy = Toy(width=256)
    mgr = managers(persist_interval=None, persist_bandwidth=1)
    mgr.restore(toy.state)
    starts: list[tuple[int, float]] = []
    step = 0

    def save() -> None:
        nonlocal step
        step += 1
        before = mgr.stats.persists
        toy.step()
        at = time.monotonic()
        mgr.save(step, toy.state)
        if mgr.stats.persists > before:
            starts.append((step, at))

    save()
    assert mgr.wait_persist(30)
    took = mgr.stats.last_persist_s
    assert took is not None and took > 0.2  # the throttle: 256 KiB and more at 1 MB/s
    wait_for(lambda: save() or len(starts) == 2, 30, "a second persist")
    assert starts[1][1] - starts[0][1] >= took / AUTO_DUTY
    assert starts[1][0] > 2, "the saves in between reached memory only"


def test_storage_wins_when_it_is_fresher_than_memory(managers):
    toy = Toy()
    first = managers()
    first.restore(toy.state)
    train(toy, first, range(1, 3), persist_each=True)
    first.close(persist_last=False)
    # Another job writes newer checkpoints to the same directory; the first job's memory is older.
    other = managers(job_id=f"{managers.job}-b")
    train(toy, other, range(3, 6))
    other.close()
    try:
        mgr = managers()
        assert mgr.restore(Toy().state) == 5 and mgr.restored.tier == "storage"
        mgr.close(persist_last=False)
    finally:
        shutil.rmtree(ckpt.memory_tier_dir(f"{managers.job}-b"), ignore_errors=True)


def test_a_corrupt_checkpoint_is_skipped_with_a_warning(managers, capfd):
    toy = Toy()
    mgr = managers(memory=False)
    mgr.restore(toy.state)
    train(toy, mgr, range(1, 5), persist_each=True)
    mgr.close(persist_last=False)
    step4 = managers.directory / storage.step_dir_name(4)
    step3 = managers.directory / storage.step_dir_name(3)
    data = step4 / storage.data_file_name(0)
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF  # one flipped bit-pattern in the tensor bytes
    data.write_bytes(bytes(raw))
    (step3 / storage.MANIFEST).write_text('{"format": "ftrun-checkpoint/1", "st')  # torn
    capfd.readouterr()
    mgr2 = managers(memory=False)
    assert mgr2.restore(Toy().state) == 2
    err = capfd.readouterr().err
    assert "step-0000000004 is corrupt" in err and "fails its XXH3 check" in err
    assert "step-0000000003 is not a valid checkpoint" in err


def test_nothing_valid_is_an_error_not_a_fresh_start(managers):
    toy = Toy()
    mgr = managers(memory=False)
    mgr.restore(toy.state)
    train(toy, mgr, range(1, 2))
    mgr.close()
    (managers.directory / storage.step_dir_name(1) / storage.data_file_name(0)).write_bytes(b"")
    mgr2 = managers(memory=False)
    with pytest.raises(ckpt.CheckpointError) as err:
        mgr2.restore(Toy().state)
    assert "no valid checkpoint" in err.value.message and err.value.hint


def test_keeps_the_last_k(managers):
    toy = Toy()
    mgr = managers(memory=False, keep=2)
    mgr.restore(toy.state)
    train(toy, mgr, range(1, 6), persist_each=True)
    mgr.close()
    names = sorted(p.name for p in managers.directory.iterdir())
    assert names == [storage.step_dir_name(4), storage.step_dir_name(5)]


def test_restore_reports_one_line_with_the_step_and_tier(managers, capfd):
    """The line `ftrun inspect` reads back from the rank's log (ftrun/jobview.py)."""
    toy = Toy()
    mgr = managers()
    mgr.restore(toy.state)
    assert "ftrun-checkpoint: no checkpoint found, starting from step 0" in capfd.readouterr().out
    train(toy, mgr, range(1, 3))
    mgr.close()
    assert managers().restore(Toy().state) == 2
    assert "ftrun-checkpoint: restored step 2 from memory\n" in capfd.readouterr().out
    assert managers(memory=False).restore(Toy().state) == 2
    assert "ftrun-checkpoint: restored step 2 from storage\n" in capfd.readouterr().out


def test_user_errors_carry_a_message_and_a_hint(managers, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ckpt.CheckpointDirError) as err:
        ckpt.Manager(afile, memory=False)
    assert "not a directory" in err.value.message and err.value.hint
    toy = Toy()
    mgr = managers(memory=False)
    with pytest.raises(ckpt.StateError):
        mgr.restore([toy.model])  # type: ignore[arg-type]
    mgr.restore(toy.state)
    train(toy, mgr, range(1, 2))
    mgr.close()
    with pytest.raises(ckpt.CheckpointError, match="closed"):
        mgr.save(2, toy.state)
    wider = Toy(width=16)
    with pytest.raises(ckpt.StateError) as err:
        managers(memory=False).restore(wider.state)
    assert err.value.hint


def test_a_dead_persist_worker_is_reported(managers):
    toy = Toy()
    mgr = managers(memory=False)
    mgr.restore(toy.state)
    os.kill(mgr._client.proc.pid, signal.SIGKILL)
    wait_for(lambda: mgr._worker_gone, 10, "the manager to notice its worker died")
    with pytest.raises(ckpt.CheckpointError, match="persist worker died"):
        mgr.save(1, toy.state)


def test_dtensor_like_state_is_refused_clearly(managers):
    class Fancy(torch.Tensor):
        pass

    mgr = managers(memory=False)
    with pytest.raises(ckpt.StateError, match="only plain tensors"):
        mgr.save(1, {"x": torch.zeros(2).as_subclass(Fancy)})


def test_a_bare_top_level_value_is_refused_since_it_could_not_be_restored(managers):
    mgr = managers(memory=False)
    with pytest.raises(ckpt.StateError) as err:
        mgr.save(1, {"step": 3})
    assert "'step'" in err.value.message and err.value.hint


@pytest.mark.parametrize("memory", [False, True], ids=["storage", "memory"])
def test_a_newer_generation_fences_off_the_older_ones_writes(managers, memory):
    """Generation 1 of a job trains on after generation 2 has started (a partitioned host's
    zombie): once generation 2's Manager exists, nothing generation 1 saves is published. With
    the memory tier the save itself is refused, before a byte is copied; without it, its commit
    to storage is, and the save after that raises."""
    owner = managers.job
    zombie_toy = Toy(seed=0)
    zombie = managers(memory=memory, owner=owner, generation=1, keep=10)
    zombie.restore(zombie_toy.state)
    train(zombie_toy, zombie, range(1, 4), persist_each=True)  # steps 1-3 committed
    survivor = managers(memory=memory, owner=owner, generation=2, keep=10)
    assert survivor.restore(Toy(seed=1).state) == 3
    zombie_toy.step()
    if memory:
        with pytest.raises(ckpt.Superseded, match="generation 2 has claimed"):
            zombie.save(4, zombie_toy.state)
    else:
        zombie.save(4, zombie_toy.state)  # copied to the rank's own anonymous memory...
        assert zombie.wait_persist(30)  # ... and refused at the commit
        assert zombie.stats.last_persisted_step == 3
        with pytest.raises(ckpt.Superseded, match="generation 2 has claimed"):
            zombie.save(5, zombie_toy.state)
    steps = [
        c.step for c in storage.list_candidates(managers.directory, key=zombie.config.hmac_key)[0]
    ]
    assert steps == [3, 2, 1]
    assert not [p for p in managers.directory.iterdir() if p.name.startswith(".tmp-")]
    # The survivor is not hindered, and what it restores next is its own.
    toy = Toy(seed=1)
    survivor.restore(toy.state)
    train(toy, survivor, range(4, 6), persist_each=True)
    survivor.close()
    third = managers(memory=memory, owner=owner, generation=3)
    assert third.restore(Toy(seed=2).state) == 5


def test_a_save_waits_for_the_hosts_other_ranks_at_most_the_snapshot_timeout(managers, capfd):
    """make_room() in a real tier: a record of this run says rank 1 of the host has completed
    step 2 only, so the save of 5, whose slot holds step 2, waits for it to get past that step,
    `snapshot_timeout` at most, then goes on and says so. Another run's record holds nothing
    back; this rank's own record is its newest step."""
    mgr = managers(snapshot_timeout=0.5, persist_every=1000)  # no persist pins a slot
    toy = Toy()
    assert mgr.config.memory_dir is not None
    peer = mgr.config.memory_dir / "rank1"
    peer.mkdir(mode=0o700)
    host_progress.publish(peer, run="another run", step=0)
    train(toy, mgr, range(1, 5))  # the save of 4 writes over step 1
    assert mgr.stats.host_wait_s < 0.5
    run = mgr._tier.run
    assert run is not None
    host_progress.publish(peer, run=run, step=2)
    train(toy, mgr, range(5, 6))
    assert mgr.stats.host_wait_s >= 0.5
    err = capfd.readouterr().err
    assert "the snapshot of step 2 is written over, though rank(s) 1 of this host" in err, err
    assert mgr.wait_ready(30)
    assert sorted(mgr._slots.step(i) or 0 for i in range(3)) == [3, 4, 5]
    assert host_progress.steps(peer, run=run) == {0: 5, 1: 2}
