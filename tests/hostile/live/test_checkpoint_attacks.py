"""ftrun.checkpoint.Manager, with its real persist worker, against pickles another user planted in
its checkpoints: each is skipped with a reason and restore falls back (an older checkpoint, or
storage instead of memory); none runs. A checkpoint written under the job's key restores after a
"restart" under the same key, and under another key not at all."""

from __future__ import annotations

import json

import pytest

import ftrun.checkpoint as ckpt
from ftrun import envcontract
from ftrun.checkpoint import storage
from tests.hostile.planted import assert_live, evil_pickle
from tests.integration.ckpt_helpers import Managers, Toy, assert_same

JOB_KEY = "5a" * 32


@pytest.fixture
def managers(tmp_path, monkeypatch):
    monkeypatch.setenv(envcontract.CHECKPOINT_KEY, JOB_KEY)  # as the agent sets it for a rank
    made = Managers(tmp_path)
    yield made
    made.cleanup()


def persist_steps(managers: Managers, steps: range, **options) -> Toy:
    toy = Toy()
    mgr = managers(**options)
    mgr.restore(toy.state)
    for step in steps:
        toy.step()
        mgr.save(step, toy.state)
        assert mgr.wait_persist(30)
    mgr.close(persist_last=False)
    return toy


def test_storage_written_under_the_jobs_key_restores_after_a_restart(managers, monkeypatch):
    toy = persist_steps(managers, range(1, 3), memory=False)
    mgr = managers(memory=False)  # the same job, restarted: the key comes from its job dir again
    fresh = Toy(seed=9)
    assert mgr.restore(fresh.state) == 2 and mgr.restored.tier == "storage"
    assert_same(fresh.tensors(), toy.tensors())

    monkeypatch.setenv(envcontract.CHECKPOINT_KEY, "a5" * 32)  # another job's key
    other = managers(memory=False)
    with pytest.raises(ckpt.CheckpointError, match="no valid checkpoint") as err:
        other.restore(Toy().state)
    assert envcontract.CHECKPOINT_KEY in err.value.hint
    assert all("not authenticated" in why for why in err.value.data["skipped"])


@pytest.mark.parametrize("name", [storage.objects_file_name(0), storage.METADATA])
def test_a_pickle_planted_in_the_newest_checkpoint_never_runs(managers, tmp_path, capfd, name):
    persist_steps(managers, range(1, 4), memory=False)
    newest = managers.directory / storage.step_dir_name(3)
    want = storage.read_manifest(newest, key=bytes.fromhex(JOB_KEY))["files"][name]
    marker = tmp_path / "the-planted-pickle-ran"
    blob = evil_pickle(marker, size=want["size"], crc32=want["crc32"])  # size and CRC32 match
    assert_live(blob, marker)
    (newest / name).write_bytes(blob)
    capfd.readouterr()
    for verify in ("full", "size"):
        mgr = managers(memory=False, verify=verify)
        assert mgr.restore(Toy().state) == 2  # the previous good one
        err = capfd.readouterr().err
        assert f"step-0000000003 is corrupt (rank 0: {name} is not authenticated" in err
        mgr.close(persist_last=False)
    assert not marker.exists()


def test_a_pickle_planted_in_the_memory_tier_never_runs(managers, tmp_path, capfd):
    toy = Toy()
    mgr = managers()
    mgr.restore(toy.state)
    for step in (1, 2):
        toy.step()
        mgr.save(step, toy.state)
        assert mgr.wait_persist(30)
    toy.step()
    mgr.save(3, toy.state)  # in memory only (the one before it is persisted)
    mgr.close(persist_last=False)
    rank_dir = ckpt.memory_tier_dir(managers.job) / "rank0"
    marker = tmp_path / "the-planted-pickle-ran"
    for manifest in rank_dir.glob("slot*.json"):  # the size and CRC32 each manifest records
        want = json.loads(manifest.read_text())
        blob = evil_pickle(marker, size=want["objects_size"], crc32=want["objects_crc32"])
        manifest.with_suffix(".objects").write_bytes(blob)
    capfd.readouterr()
    mgr2 = managers()
    assert mgr2.restore(Toy().state) >= 2 and mgr2.restored.tier == "storage"
    err = capfd.readouterr().err
    assert "is not loaded: not sealed by ftrun.checkpoint" in err
    assert not marker.exists()
