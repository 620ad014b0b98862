"""The checkpoint storage tier against a user who can write into it: pickles planted in a committed
checkpoint with the size and CRC32 its manifest records, forged manifests, FIFOs and links where
a file goes, deeply nested JSON. Verification turns each into a reason; nothing runs or hangs."""

from __future__ import annotations

import json
import os
import stat
import zlib
from pathlib import Path

import pytest

from ftrun.checkpoint import auth, storage
from ftrun.checkpoint.errors import UnsafePathError
from tests.hostile.planted import OTHER_UID, assert_live, evil_pickle

KEY = bytes(range(32))
OTHER_KEY = bytes([7] * 32)


def make_checkpoint(root: Path, step: int, key: bytes = KEY) -> Path:
    """A committed checkpoint as the worker writes it: data, sealed pickles, manifest, rename."""
    tmp = root / storage.tmp_dir_name(step, 1, "abc")
    storage.private_subdir(tmp)
    files = {}
    for name, data in (
        (storage.data_file_name(0), os.urandom(8192)),
        (
            storage.objects_file_name(0),
            auth.dumps(key, {"global": {"x": step, "pad": "p" * 1000}, "local": {}}),
        ),
        (storage.METADATA, auth.dumps(key, {"metadata": list(range(200))})),
    ):
        files[name] = {"size": len(data), "crc32": storage.write_file(tmp / name, data)}
    storage.write_json_atomic(
        tmp / storage.MANIFEST,
        {"format": storage.FORMAT, "step": step, "generation": 1, "world_size": 1, "files": files},
        key=key,
    )
    final = root / storage.step_dir_name(step)
    storage.commit_dir(tmp, final)
    return final


def verify(ckpt: Path, *, full: bool = True, key: bytes = KEY) -> str | None:
    manifest = storage.read_manifest(ckpt, key=key)
    return storage.verify_files(ckpt, manifest, sorted(manifest["files"]), full=full, key=key)


def test_what_the_storage_tier_makes_is_private(tmp_path):
    root = tmp_path / "a" / "b" / "checkpoints"
    storage.prepare_directory(root)
    ckpt = make_checkpoint(root, 1)
    for directory in (tmp_path / "a", tmp_path / "a" / "b", root, ckpt):
        assert stat.S_IMODE(os.lstat(directory).st_mode) == 0o700, directory
    for path in ckpt.iterdir():
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600, path
    assert verify(ckpt) is None


@pytest.mark.parametrize("full", [True, False], ids=["full", "size-only"])
@pytest.mark.parametrize("name", [storage.objects_file_name(0), storage.METADATA])
def test_a_planted_pickle_with_the_manifests_size_and_crc_is_refused(tmp_path, name, full):
    """The manifest is genuine and verifies; the pickle beside it is the other user's, forced to
    the size and CRC32 the manifest records. Only the seal tells them apart."""
    ckpt = make_checkpoint(tmp_path, 5)
    want = storage.read_manifest(ckpt, key=KEY)["files"][name]
    marker = tmp_path / "the-planted-pickle-ran"
    blob = evil_pickle(marker, size=want["size"], crc32=want["crc32"])
    assert_live(blob, marker)
    (ckpt / name).write_bytes(blob)
    assert zlib.crc32((ckpt / name).read_bytes()) == want["crc32"]
    reason = verify(ckpt, full=full)
    assert reason == f"{name} is not authenticated: not sealed by ftrun.checkpoint"
    with pytest.raises(auth.NotAuthentic):
        auth.loads(KEY, (ckpt / name).read_bytes())
    assert not marker.exists()


def test_a_checkpoint_under_another_key_is_not_a_candidate(tmp_path):
    make_checkpoint(tmp_path, 3)
    make_checkpoint(tmp_path, 4, key=OTHER_KEY)
    good, bad = storage.list_candidates(tmp_path, key=KEY)
    assert [c.step for c in good] == [3]
    assert [(p.name, why) for p, why in bad] == [
        (
            storage.step_dir_name(4),
            "manifest.json is not authenticated by this job's checkpoint key",
        )
    ]


def test_a_forged_manifest_with_a_valid_crc_is_not_a_candidate(tmp_path):
    ckpt = make_checkpoint(tmp_path, 3)
    doc = json.loads((ckpt / storage.MANIFEST).read_text())
    body = {k: v for k, v in doc.items() if k not in ("crc32", "hmac")}
    forged = {**body, "generation": 9}  # any change: here, what a restore would report
    for variant in ({}, {"hmac": doc["hmac"]}, {"hmac": "00" * 32}, {"hmac": 7}):
        (ckpt / storage.MANIFEST).write_text(
            json.dumps({**forged, "crc32": storage.canonical_crc(forged), **variant})
        )
        good, bad = storage.list_candidates(tmp_path, key=KEY)
        assert good == [] and "not authenticated" in bad[0][1], variant
    # a manifest's tag is no pickle's seal: domain-separated
    tag = bytes.fromhex(auth.json_tag(KEY, body))
    with pytest.raises(auth.NotAuthentic):
        auth.unseal(KEY, auth.PICKLE_MAGIC + tag + auth.canonical(body))


def test_a_fifo_in_place_of_a_file_is_a_reason_not_a_hang(tmp_path):
    ckpt = make_checkpoint(tmp_path, 2)
    for name in (storage.data_file_name(0), storage.objects_file_name(0)):
        os.unlink(ckpt / name)
        os.mkfifo(ckpt / name)
    assert verify(ckpt) == f"{storage.data_file_name(0)} is not a regular file"
    os.unlink(ckpt / storage.MANIFEST)
    os.mkfifo(ckpt / storage.MANIFEST)
    _, bad = storage.list_candidates(tmp_path, key=KEY)
    assert "not a regular file" in bad[0][1]


def test_a_link_in_place_of_a_checkpoint_file_is_not_followed(tmp_path):
    ckpt = make_checkpoint(tmp_path, 2)
    name = storage.objects_file_name(0)
    real = tmp_path / "real-objects"
    os.rename(ckpt / name, real)
    (ckpt / name).symlink_to(real)
    assert verify(ckpt).startswith(f"{name} is not a regular file")


def test_deeply_nested_json_is_a_reason_not_a_crash(tmp_path):
    ckpt = make_checkpoint(tmp_path, 2)
    (ckpt / storage.MANIFEST).write_text("[" * 200_000 + "]" * 200_000)
    _, bad = storage.list_candidates(tmp_path, key=KEY)
    assert "unreadable" in bad[0][1]


def test_a_link_planted_where_a_file_will_be_written_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    target = tmp_path / "checkpoints" / "manifest.json"
    target.parent.mkdir()
    target.symlink_to(victim)
    (target.parent / "manifest.json.tmp").symlink_to(victim)
    storage.write_json_atomic(target, {"a": 1}, key=KEY)
    storage.write_file(target.parent / "pkl", b"x")
    assert victim.read_bytes() == b"precious"
    assert storage.read_json_checked(target, key=KEY) == {"a": 1}
    assert stat.S_IMODE(os.lstat(target).st_mode) == 0o600


@pytest.mark.parametrize("how", ["another owner", "group-writable"])
def test_a_temp_directory_another_user_made_is_refused(tmp_path, how):
    tmp = tmp_path / storage.tmp_dir_name(7, 1, "abc")
    tmp.mkdir(mode=0o700)
    if how == "another owner":
        os.chown(tmp, OTHER_UID, OTHER_UID)
    else:
        os.chmod(tmp, 0o770)
    with pytest.raises(UnsafePathError, match=f"{tmp.name} is not safe to use"):
        storage.private_subdir(tmp)
