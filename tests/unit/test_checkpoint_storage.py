"""ftrun.checkpoint storage tier and config: manifests, verification, commit, pruning (no torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ftrun.checkpoint import auth, digest, storage
from ftrun.checkpoint.config import CheckpointConfig, memory_tier_dir, resolve_config
from ftrun.checkpoint.errors import CheckpointDirError
from ftrun.errors import UsageError

KEY = bytes(range(32))  # the checkpoint key (auth.py) every file here is written under


def make_checkpoint(
    root: Path, step: int, payload: bytes = b"x" * 5000, *, data_crc32: bool = False
) -> Path:
    """A committed checkpoint as the worker writes it (files + manifest + rename): tensor data
    with its XXH3, or with the CRC32 that checkpoints written before digest.py carry."""
    tmp = root / storage.tmp_dir_name(step, 1, "abc")
    tmp.mkdir(parents=True)
    files = {}
    for name, data in (
        (storage.data_file_name(0), payload),
        (storage.METADATA, auth.seal(KEY, b"meta")),
    ):
        files[name] = {"size": len(data), "crc32": storage.write_file(tmp / name, data)}
    if not data_crc32:
        checksum = digest.DataDigest()
        checksum.update(payload)
        files[storage.data_file_name(0)] = checksum.entry(len(payload))
    storage.write_json_atomic(
        tmp / storage.MANIFEST,
        {"format": storage.FORMAT, "step": step, "generation": 1, "world_size": 1, "files": files},
        key=KEY,
    )
    final = root / storage.step_dir_name(step)
    storage.commit_dir(tmp, final)
    return final


def test_json_round_trip_and_tampering_is_detected(tmp_path):
    path = tmp_path / "m.json"
    storage.write_json_atomic(path, {"a": 1, "b": [1, 2]}, key=KEY)
    assert storage.read_json_checked(path, key=KEY) == {"a": 1, "b": [1, 2]}
    doc = json.loads(path.read_text())
    doc["a"] = 2
    path.write_text(json.dumps(doc))
    with pytest.raises(storage.Invalid, match="checksum"):
        storage.read_json_checked(path, key=KEY)
    path.write_text('{"a": 1, "crc')  # torn
    with pytest.raises(storage.Invalid, match="unreadable"):
        storage.read_json_checked(path, key=KEY)
    with pytest.raises(storage.Invalid, match="missing"):
        storage.read_json_checked(tmp_path / "absent.json", key=KEY)


def test_candidates_are_newest_first_and_only_committed(tmp_path):
    for step in (5, 20, 10):
        make_checkpoint(tmp_path, step)
    (tmp_path / storage.tmp_dir_name(30, 1, "abc")).mkdir()  # in progress: invisible
    (tmp_path / storage.step_dir_name(40)).mkdir()  # no manifest: reported as bad
    (tmp_path / "notes.txt").write_text("unrelated")
    good, bad = storage.list_candidates(tmp_path, key=KEY)
    assert [c.step for c in good] == [20, 10, 5]
    assert [(p.name, why) for p, why in bad] == [
        (storage.step_dir_name(40), "manifest.json is missing")
    ]
    assert storage.list_candidates(tmp_path / "missing", key=KEY) == ([], [])


@pytest.mark.parametrize(
    "damage, reason, data_crc32",
    [
        (lambda p: p.write_bytes(p.read_bytes()[:-1]), "has 4999 bytes", False),
        (lambda p: p.write_bytes(b"y" + p.read_bytes()[1:]), "fails its XXH3 check", False),
        (lambda p: p.write_bytes(b"y" + p.read_bytes()[1:]), "fails its CRC32 check", True),
        (lambda p: p.unlink(), "missing", False),
    ],
)
def test_verify_catches_torn_and_corrupt_files(tmp_path, damage, reason, data_crc32):
    ckpt = make_checkpoint(tmp_path, 7, data_crc32=data_crc32)
    manifest = storage.read_manifest(ckpt, key=KEY)
    names = list(manifest["files"])
    assert storage.verify_files(ckpt, manifest, names, full=True, key=KEY) is None
    damage(ckpt / storage.data_file_name(0))
    assert reason in storage.verify_files(ckpt, manifest, names, full=True, key=KEY)


def test_a_manifest_entry_without_a_checksum_fails_full_verification(tmp_path):
    ckpt = make_checkpoint(tmp_path, 7)
    manifest = storage.read_manifest(ckpt, key=KEY)
    del manifest["files"][storage.data_file_name(0)][digest.DATA]
    names = [storage.data_file_name(0)]
    assert "has no checksum" in storage.verify_files(ckpt, manifest, names, full=True, key=KEY)


def test_size_only_verification_skips_checksums(tmp_path):
    ckpt = make_checkpoint(tmp_path, 7)
    manifest = storage.read_manifest(ckpt, key=KEY)
    data = ckpt / storage.data_file_name(0)
    data.write_bytes(b"y" + data.read_bytes()[1:])
    assert (
        storage.verify_files(ckpt, manifest, list(manifest["files"]), full=False, key=KEY) is None
    )


def test_commit_replaces_an_older_directory_of_the_same_step(tmp_path):
    make_checkpoint(tmp_path, 3, payload=b"old")
    make_checkpoint(tmp_path, 3, payload=b"newer")
    good, _ = storage.list_candidates(tmp_path, key=KEY)
    assert [c.step for c in good] == [3]
    assert (good[0].path / storage.data_file_name(0)).read_bytes() == b"newer"
    assert sorted(p.name for p in tmp_path.iterdir()) == [storage.step_dir_name(3)]


def test_prune_keeps_the_newest_k_and_removes_stale_temp_dirs(tmp_path):
    for step in range(1, 6):
        make_checkpoint(tmp_path, step)
    stale = tmp_path / storage.tmp_dir_name(9, 0, "old")
    current = tmp_path / storage.tmp_dir_name(10, 1, "now")
    stale.mkdir()
    current.mkdir()
    storage.prune(tmp_path, 2, key=KEY, current_tmp=current)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [storage.step_dir_name(5), storage.step_dir_name(4), current.name]
    )


def test_memory_tier_dir_and_job_id_validation():
    assert memory_tier_dir("job-1.a_b") == Path(f"/dev/shm/ftrun-{os.geteuid()}/job-1.a_b")
    from ftrun.agent import workdir  # the agent deletes this directory at job end

    assert workdir.memory_tier("job-1.a_b") == memory_tier_dir("job-1.a_b")
    assert memory_tier_dir("j", root="/x") == Path(f"/x/ftrun-{os.geteuid()}/j")
    for bad in ("", "../etc", "a/b", "-x"):
        with pytest.raises(CheckpointDirError):
            memory_tier_dir(bad)


def test_config_precedence_explicit_then_ftrun_env_then_cwd(tmp_path):
    env = {
        "FTRUN_JOB_DIR": str(tmp_path / "job"),
        "FTRUN_JOB_ID": "j1",
        "FTRUN_GENERATION": "3",
        "TORCHELASTIC_RESTART_COUNT": "1",
    }
    cfg = resolve_config(environ=env)
    assert (cfg.directory, cfg.job_id, cfg.generation) == (
        tmp_path / "job" / "checkpoints",
        "j1",
        3,
    )
    # Under plain torchrun --max-restarts, its restart count tells the runs apart.
    assert resolve_config(environ={"TORCHELASTIC_RESTART_COUNT": "2"}).generation == 2
    assert cfg.memory_dir == Path(f"/dev/shm/ftrun-{os.geteuid()}/j1")
    assert resolve_config(tmp_path / "explicit", environ=env).directory == tmp_path / "explicit"
    assert resolve_config(environ={}).directory == Path("checkpoints").absolute()
    assert resolve_config(environ=env, memory=False).job_id is None
    assert resolve_config(environ={}, job_id="mine").job_id == "mine"


def test_config_reports_every_problem_at_once():
    with pytest.raises(UsageError) as err:
        CheckpointConfig(directory=Path("/tmp/x"), keep=0, memory_slots=5, persist_priority="max")
    assert "keep" in err.value.message and "memory_slots" in err.value.message
    assert "persist_priority" in err.value.message and err.value.hint
    with pytest.raises(CheckpointDirError, match="needs a job id"):
        resolve_config(environ={}, memory=True)


def test_imports_stay_light():
    """ftrun.checkpoint pulls in neither the CLI nor the controller; the worker not even torch."""
    code = (
        "import sys, ftrun.checkpoint as c; c.Manager; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('typer', 'rich') "
        "or m.startswith(('ftrun.cli', 'ftrun.controller', 'ftrun.agent'))]; "
        "assert not bad, bad; "
        "import ftrun.checkpoint.worker; print('ok')"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr
    code = "import sys, ftrun.checkpoint.worker; assert 'torch' not in sys.modules; print('ok')"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr
