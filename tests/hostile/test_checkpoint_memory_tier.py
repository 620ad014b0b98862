"""The checkpoint memory tier in the real /dev/shm against another user of the host: directories
made first by them or open to them, links planted where a file goes, pickles planted with a valid
CRC32. Every attack is refused with a clear error, or the snapshot is skipped with a reason and
restore falls back; a planted pickle never runs, a victim file never changes."""

from __future__ import annotations

import json
import os
import shutil
import stat
import uuid
import zlib
from pathlib import Path

import pytest
import torch

from ftrun import private
from ftrun.checkpoint import auth, restore, slots, state
from ftrun.checkpoint.comm import Comm
from ftrun.checkpoint.config import CheckpointConfig, memory_tier_dir
from ftrun.checkpoint.errors import UnsafePathError
from tests.hostile.planted import OTHER_UID, assert_live, evil_pickle, force_crc32

KEY = bytes(range(32))
OTHER_KEY = bytes([7] * 32)


@pytest.fixture
def shm():
    """A job's memory tier directory in the real /dev/shm (not made yet, in this user's private
    parent), removed after."""
    path = memory_tier_dir(f"hostile-{uuid.uuid4().hex[:10]}")
    private.make_dirs(path.parent)
    yield path
    if path.is_symlink():
        path.unlink()
    shutil.rmtree(path, ignore_errors=True)


def tier(
    shm: Path, key: bytes = KEY, *, world_size: int = 1, where: str = "rank0"
) -> slots.MemoryTier:
    rank = int(where.rpartition("rank")[2])
    return slots.MemoryTier(
        directory=shm / where, slots=2, rank=rank, world_size=world_size, key=key
    )


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_tier_directory_another_user_made_first_is_refused(shm):
    shm.mkdir(mode=0o700)
    os.chown(shm, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafePathError) as err:
        tier(shm)
    message = err.value.message
    assert str(shm) in message and "owned by uid 65534" in message and "drwx------" in message
    assert "remove it" in err.value.hint and "memory_root" in err.value.hint
    assert os.listdir(shm) == []  # nothing of ours went into it


def test_every_tier_is_under_a_private_parent_of_this_user(shm):
    """No other user can reach into it: nothing can be planted in a tier, whatever its name."""
    assert shm.parent.name == f"ftrun-{os.geteuid()}"
    tier(shm).close()
    st = os.lstat(shm.parent)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and mode_of(shm.parent) == 0o700


def test_a_private_parent_another_user_made_first_is_refused_naming_it(tmp_path):
    """The one name left to plant: refused as the root cause, with the directory and why."""
    root = tmp_path / "root"
    root.mkdir()
    os.chmod(root, 0o1777)  # like /dev/shm
    job = memory_tier_dir("planted", root=root)
    job.parent.mkdir(mode=0o700)
    os.chown(job.parent, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafePathError) as err:
        tier(job)
    assert f"{job.parent} is not safe to use: it is owned by uid 65534" in err.value.message
    assert os.listdir(job.parent) == []


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770, 0o755, 0o750, 0o705])
def test_a_tier_directory_open_to_group_or_others_is_refused(shm, mode):
    shm.mkdir()
    os.chmod(shm, mode)
    with pytest.raises(UnsafePathError, match="group or other users can") as err:
        tier(shm)
    assert f"({mode:04o})" in err.value.message
    assert os.listdir(shm) == []


def test_the_rank_directory_is_checked_as_well(shm):
    shm.mkdir(mode=0o700)
    (shm / "rank0").mkdir(mode=0o700)
    os.chown(shm / "rank0", OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafePathError, match="rank0 is not safe to use: it is owned by uid 65534"):
        tier(shm)


def test_a_link_in_place_of_the_tier_directory_is_refused(shm, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    shm.symlink_to(elsewhere)
    with pytest.raises(UnsafePathError, match="it is a symbolic link"):
        tier(shm)
    assert os.listdir(elsewhere) == []


def test_what_the_tier_makes_is_private(shm):
    mem = tier(shm)
    try:
        mem.commit(0, step=1, generation=0, sig="s", entries=[], objects=b"x", data_size=0)
    finally:
        mem.close()
    assert mode_of(shm) == mode_of(shm / "rank0") == 0o700
    for name in ("slot0.data", "slot1.data", "slot0.objects", "slot0.json"):
        assert mode_of(shm / "rank0" / name) == 0o600, name


def test_a_link_planted_in_place_of_a_slot_file_is_refused_and_the_victim_is_unchanged(
    shm, tmp_path
):
    slots.ensure_tier_dirs(shm / "rank0")  # the job's own directories: someone got in anyway
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (shm / "rank0" / "slot0.data").symlink_to(victim)
    with pytest.raises(UnsafePathError, match="slot0.data is not safe to use: it is a symbolic"):
        tier(shm)
    assert victim.read_bytes() == b"precious" and mode_of(victim) == 0o644


@pytest.mark.parametrize("how", ["another owner", "mode 0644", "a second hard link"])
def test_a_slot_file_that_is_not_ours_alone_is_refused(shm, tmp_path, how):
    slots.ensure_tier_dirs(shm / "rank0")
    data = shm / "rank0" / "slot0.data"
    data.write_bytes(b"")
    os.chmod(data, 0o600)
    if how == "another owner":
        os.chown(data, OTHER_UID, OTHER_UID)
    elif how == "mode 0644":
        os.chmod(data, 0o644)
    else:
        os.link(data, shm / "rank0" / "elsewhere")
    with pytest.raises(UnsafePathError, match="slot0.data is not safe to use"):
        tier(shm)


def test_links_planted_where_the_manifest_and_objects_go_are_replaced_not_followed(shm, tmp_path):
    mem = tier(shm)
    victims = {}
    for name in ("slot0.objects", "slot0.json", "slot0.json.tmp"):
        victims[name] = tmp_path / f"victim-{name}"
        victims[name].write_bytes(b"precious")
        (shm / "rank0" / name).symlink_to(victims[name])
    try:
        mem.commit(0, step=1, generation=0, sig="s", entries=[], objects=b"x", data_size=0)
    finally:
        mem.close()
    for name, victim in victims.items():
        assert victim.read_bytes() == b"precious", name
    for name in ("slot0.objects", "slot0.json"):
        st = os.lstat(shm / "rank0" / name)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600


# -- planted pickles: scan() and restore() never load them ------------------------------------


def saved_snapshot(
    shm: Path, *, world_size: int = 1, where: str = "rank0"
) -> tuple[state.Flat, str]:
    """A real snapshot of a tiny state at step 3 in slot 0; returns the state and its layout."""
    flat = state.flatten({"m": {"w": torch.arange(4.0)}, "x": {"epoch": 3}})
    keyed = state.keyed_tensors(flat, 0)
    entries, size = slots.layout(keyed)
    sig = slots.signature(entries, world_size)
    mem = tier(shm, world_size=world_size, where=where)
    try:
        slot = mem.slots[0]
        slot.ensure(size)
        for (_, tensor), entry in zip(keyed, entries, strict=True):
            slot.view(entry).copy_(tensor)
        objects = state.pickle_objects(flat, key=KEY)
        mem.commit(
            0,
            step=3,
            generation=0,
            sig=sig,
            entries=entries,
            objects=objects,
            data_size=size,
        )
    finally:
        mem.close()
    return flat, sig


def restore_from(shm: Path, flat: state.Flat, tmp_path: Path, key: bytes = KEY):
    mem = tier(shm, key)
    config = CheckpointConfig(directory=tmp_path / "storage", job_id=shm.name[6:], key=key)
    try:
        restored, _, _ = restore.restore(flat, comm=Comm(timeout_s=10), tier=mem, config=config)
    finally:
        mem.close()
    return restored


def test_an_untouched_snapshot_restores_from_memory_with_the_right_key(shm, tmp_path):
    flat, _ = saved_snapshot(shm)
    assert restore_from(shm, flat, tmp_path).tier == "memory"


def test_a_snapshot_of_another_layout_on_this_host_restores_its_tensors_from_memory(shm, tmp_path):
    """Saved by rank 0 of 2 ranks, restored by 1: the layout differs, the tensors are there."""
    saved_snapshot(shm, world_size=2)
    flat = state.flatten({"m": {"w": torch.zeros(4)}, "x": {"epoch": 0}})
    restored = restore_from(shm, flat, tmp_path)
    assert (restored.step, restored.tier) == (3, "memory")
    assert torch.equal(flat.tensors[0].tensor, torch.arange(4.0))


def test_a_replica_the_peer_copy_keeps_here_serves_another_layout_too(shm, tmp_path):
    """Rank 1 of 2 ran on another host; its replica is in this host's replica/rank1/."""
    saved_snapshot(shm, world_size=2, where="replica/rank1")
    flat = state.flatten({"m": {"w": torch.zeros(4)}, "x": {"epoch": 0}})
    assert restore_from(shm, flat, tmp_path).tier == "memory"
    assert torch.equal(flat.tensors[0].tensor, torch.arange(4.0))


def test_a_snapshot_of_another_layout_that_lacks_a_tensor_is_not_used(shm, tmp_path):
    saved_snapshot(shm, world_size=2)
    flat = state.flatten({"m": {"w": torch.zeros(4), "b": torch.zeros(2)}, "x": {"epoch": 0}})
    assert restore_from(shm, flat, tmp_path).tier == "none"
    assert torch.equal(flat.tensors[0].tensor, torch.zeros(4))


def test_a_snapshot_rewritten_after_the_scan_is_seen_as_changed(shm):
    """A writer deletes the manifest before it overwrites the data: a load that finds another
    manifest (or none) afterwards read data that may have changed under it."""
    saved_snapshot(shm, world_size=2)
    [snapshot], _ = slots.scan_host(shm, key=KEY)
    assert snapshot.unchanged()
    manifest = shm / "rank0" / "slot0.json"
    copy = manifest.with_name("copy.json")
    copy.write_bytes(manifest.read_bytes())
    os.replace(copy, manifest)  # the same content, a new file: rewritten
    assert not snapshot.unchanged()


def test_a_snapshot_under_another_key_is_skipped_with_the_reason(shm, tmp_path, capfd):
    flat, _ = saved_snapshot(shm)
    restored = restore_from(shm, flat, tmp_path, key=OTHER_KEY)
    assert (restored.step, restored.tier) == (0, "none")
    err = capfd.readouterr().err
    assert "slot0.json is not loaded" in err
    assert "not authenticated by this job's checkpoint key" in err


def planted_objects(shm: Path, marker: Path, *, keep_seal_header: bool) -> None:
    """Replace slot 0's objects with a pickle that runs code, of the same size and CRC32 as the
    manifest records: the manifest itself is untouched and verifies."""
    manifest = json.loads((shm / "rank0" / "slot0.json").read_text())
    objects = shm / "rank0" / "slot0.objects"
    size, crc = manifest["objects_size"], manifest["objects_crc32"]
    if keep_seal_header:  # looks sealed: the real magic and tag, another payload
        head = objects.read_bytes()[: len(auth.PICKLE_MAGIC) + auth.TAG_BYTES]
        evil = evil_pickle(marker, size=size - len(head))
        blob = force_crc32(head + evil[:-4], crc)
    else:
        blob = evil_pickle(marker, size=size, crc32=crc)
        assert_live(blob, marker)
    assert len(blob) == size and zlib.crc32(blob) == crc
    objects.write_bytes(blob)


@pytest.mark.parametrize("keep_seal_header", [False, True], ids=["bare", "sealed-look"])
def test_a_planted_objects_pickle_with_a_valid_crc_never_runs(
    shm, tmp_path, capfd, keep_seal_header
):
    flat, sig = saved_snapshot(shm)
    marker = tmp_path / "the-planted-pickle-ran"
    planted_objects(shm, marker, keep_seal_header=keep_seal_header)
    mem = tier(shm)
    try:
        found, skipped = mem.scan(sig)
    finally:
        mem.close()
    assert found == [] and len(skipped) == 1
    assert "HMAC" in skipped[0] or "not sealed" in skipped[0]
    restored = restore_from(shm, flat, tmp_path)
    assert restored.tier == "none"
    assert "slot0.json is not loaded" in capfd.readouterr().err
    assert not marker.exists()


def test_a_forged_manifest_with_a_valid_crc_is_skipped(shm, tmp_path, capfd):
    """The other user rewrites the manifest (a later step, its own CRC32) but has no key."""
    flat, _ = saved_snapshot(shm)
    path = shm / "rank0" / "slot0.json"
    doc = json.loads(path.read_text())
    body = {k: v for k, v in doc.items() if k not in ("crc32", "hmac")}
    body["step"] = 99
    path.write_text(json.dumps(dict(body, crc32=zlib.crc32(auth.canonical(body)))))
    assert restore_from(shm, flat, tmp_path).tier == "none"
    assert "not authenticated" in capfd.readouterr().err


def test_a_tampered_byte_is_refused(shm, tmp_path, capfd):
    flat, _ = saved_snapshot(shm)
    objects = shm / "rank0" / "slot0.objects"
    raw = bytearray(objects.read_bytes())
    raw[-1] ^= 0x01
    objects.write_bytes(bytes(raw))
    assert restore_from(shm, flat, tmp_path).tier == "none"
    assert "objects file does not match" in capfd.readouterr().err
