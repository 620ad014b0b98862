"""The checkpoint key and the seals made with it (ftrun/checkpoint/auth.py, ftrun/private.py):
every changed byte is caught, the key comes from the environment or a private file of the user's,
and a key file or directory that another user could read or replace is refused."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftrun import envcontract, private
from ftrun.checkpoint import auth
from ftrun.checkpoint.errors import CheckpointKeyError
from tests.hostile.planted import OTHER_UID

KEY = bytes(range(32))


def test_a_sealed_pickle_round_trips_under_its_key_only():
    blob = auth.dumps(KEY, {"step": 3, "rng": [1, 2]})
    assert auth.loads(KEY, blob) == {"step": 3, "rng": [1, 2]}
    with pytest.raises(auth.NotAuthentic, match="does not match"):
        auth.loads(bytes(32), blob)
    for short in (b"", auth.PICKLE_MAGIC, blob[: len(auth.PICKLE_MAGIC) + 5]):
        with pytest.raises(auth.NotAuthentic):
            auth.unseal(KEY, short)


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=300), where=st.integers(min_value=0), flip=st.integers(1, 255))
def test_any_changed_byte_is_caught(data, where, flip):
    blob = bytearray(auth.seal(KEY, data))
    blob[where % len(blob)] ^= flip
    with pytest.raises(auth.NotAuthentic):
        auth.unseal(KEY, bytes(blob))


def test_a_json_tag_covers_the_canonical_body():
    body = {"b": [1, 2], "a": "x"}
    tag = auth.json_tag(KEY, body)
    assert auth.json_authentic(KEY, {"a": "x", "b": [1, 2]}, tag)  # key order is not content
    assert not auth.json_authentic(KEY, {"a": "y", "b": [1, 2]}, tag)
    assert not auth.json_authentic(bytes(32), body, tag)
    assert not auth.json_authentic(KEY, body, None)


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"XDG_CONFIG_HOME": str(tmp_path / "config"), "HOME": str(tmp_path / "home"), **extra}


def test_the_environment_key_wins_and_a_bad_one_is_a_clear_error(tmp_path):
    env = env_for(tmp_path, **{envcontract.CHECKPOINT_KEY: KEY.hex()})
    assert auth.load_key(env) == KEY
    assert not (tmp_path / "config").exists()  # no file made
    for bad, why in (("xyz", "not a key"), ("ab" * 8, "at least 16 bytes")):
        env[envcontract.CHECKPOINT_KEY] = bad
        with pytest.raises(CheckpointKeyError, match=why) as err:
            auth.load_key(env)
        assert "FTRUN_CHECKPOINT_KEY" in err.value.message and err.value.hint


def test_without_one_the_users_key_file_is_made_private_once_and_reused(tmp_path):
    env = env_for(tmp_path)
    key = auth.load_key(env)
    path = tmp_path / "config" / "ftrun" / "checkpoint.key"
    assert auth.user_key_path(env) == path and len(key) == 32
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(path.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(path.parent.parent).st_mode) == 0o700  # a parent it made
    assert auth.load_key(env) == key and path.read_text().strip() == key.hex()
    assert os.listdir(path.parent) == ["checkpoint.key"]  # no temp file left


def test_a_relative_xdg_config_home_is_ignored(tmp_path):
    env = {"XDG_CONFIG_HOME": "relative/dir", "HOME": str(tmp_path)}
    assert auth.user_key_path(env) == tmp_path / ".config" / "ftrun" / "checkpoint.key"


def test_ranks_that_race_to_make_the_key_all_get_the_same_one(tmp_path):
    env = env_for(tmp_path)
    keys: list[bytes] = []
    barrier = threading.Barrier(8)

    def load() -> None:
        barrier.wait(timeout=10)
        keys.append(auth.load_key(env))

    threads = [threading.Thread(target=load) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(keys) == 8 and len(set(keys)) == 1


@pytest.mark.parametrize(
    "plant, why",
    [
        ("mode 0644", "group or other users can read it"),
        ("another owner", "owned by uid 65534"),
        ("a link", "it is a symbolic link"),
        ("a directory open to others", "group or other users can write to it"),
        ("not hex", "not a key"),
    ],
)
def test_a_key_file_another_user_could_read_or_replace_is_refused(tmp_path, plant, why):
    env = env_for(tmp_path)
    path = auth.user_key_path(env)
    private.make_dirs(path.parent)
    path.write_text(KEY.hex())
    os.chmod(path, 0o600)
    if plant == "mode 0644":
        os.chmod(path, 0o644)
    elif plant == "another owner":
        os.chown(path, OTHER_UID, OTHER_UID)
    elif plant == "a link":
        real = tmp_path / "elsewhere.key"
        os.rename(path, real)
        path.symlink_to(real)
    elif plant == "a directory open to others":
        os.chmod(path.parent, 0o777)
    else:
        path.write_text("not a key at all")
    with pytest.raises(CheckpointKeyError, match=why) as err:
        auth.load_key(env)
    assert str(path.parent if "directory" in plant else path) in err.value.message
    assert err.value.hint
