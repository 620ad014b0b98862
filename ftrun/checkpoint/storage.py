"""The storage tier on disk: directory names, manifests, verification, atomic commit, pruning.

Pure Python (no torch): the persist worker imports it, and it starts in milliseconds.

Layout of a checkpoint directory:

    <dir>/step-0000000040/          committed (renamed into place only when complete)
        manifest.json               format, step, generation, world size, every file's size + CRC32
        .metadata                   torch.distributed.checkpoint Metadata (pickled), for resharding
        __<r>_0.distcp              raw tensor bytes written by rank r (offsets in .metadata)
        __<r>_objects.pkl           rank r's non-tensor state (pickled)
    <dir>/.tmp-step-...-g<G>-<id>/  being written; never read; removed by the next commit

A commit is: every rank writes and fsyncs its files and a `part-<r>.json`, then rank 0 writes and
fsyncs `.metadata` and `manifest.json`, fsyncs the directory, renames it to `step-<N>` and fsyncs
the parent. Anything without a valid manifest is not a checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftrun.checkpoint.errors import CheckpointDirError

FORMAT = "ftrun-checkpoint/1"
MANIFEST = "manifest.json"
METADATA = ".metadata"
CHUNK = 8 << 20
_STEP_DIR = re.compile(r"^step-(\d{10})$")
_TMP_PREFIX = ".tmp-step-"
_TRASH_PREFIX = ".trash-"


class Invalid(Exception):
    """A checkpoint (or memory snapshot) that must not be loaded; the message says why."""


def prepare_directory(path: Path) -> None:
    """Create the storage directory if needed; a user error if it cannot be written to."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise CheckpointDirError(
            f"checkpoint directory {path} exists and is not a directory",
            hint="pass another directory",
        ) from None
    except OSError as exc:
        raise CheckpointDirError(
            f"cannot create checkpoint directory {path}: {exc.strerror}",
            hint="pass a writable directory",
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise CheckpointDirError(
            f"checkpoint directory {path} is not writable", hint="pass a writable directory"
        )


def step_dir_name(step: int) -> str:
    return f"step-{step:010d}"


def tmp_dir_name(step: int, generation: int, nonce: str) -> str:
    return f"{_TMP_PREFIX}{step:010d}-g{generation}-{nonce}"


def data_file_name(rank: int) -> str:
    return f"__{rank}_0.distcp"


def objects_file_name(rank: int) -> str:
    return f"__{rank}_objects.pkl"


def part_file_name(rank: int) -> str:
    return f"part-{rank}.json"


def canonical_crc(body: dict[str, Any]) -> int:
    """CRC32 of a JSON body in canonical form (sorted keys, no spaces), stored next to it."""
    return zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: Path, data: bytes, *, sync: bool = True) -> int:
    """Write bytes to path (fsynced when sync); returns their CRC32."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return zlib.crc32(data)


def write_json_atomic(path: Path, body: dict[str, Any], *, sync: bool = True) -> None:
    """Write `body` plus its own CRC to a temp file, then rename it over path."""
    doc = dict(body, crc32=canonical_crc(body))
    tmp = path.with_name(path.name + ".tmp")
    write_file(tmp, json.dumps(doc, sort_keys=True, indent=1).encode(), sync=sync)
    os.replace(tmp, path)


def read_json_checked(path: Path) -> dict[str, Any]:
    """Read a JSON file written by write_json_atomic; Invalid if missing, torn or altered."""
    try:
        doc = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise Invalid(f"{path.name} is missing") from None
    except (OSError, ValueError) as exc:
        raise Invalid(f"{path.name} is unreadable ({exc})") from None
    if not isinstance(doc, dict) or "crc32" not in doc:
        raise Invalid(f"{path.name} has no checksum")
    body = {k: v for k, v in doc.items() if k != "crc32"}
    if canonical_crc(body) != doc["crc32"]:
        raise Invalid(f"{path.name} fails its checksum")
    return body


def crc32_file(path: Path) -> tuple[int, int]:
    """(size, CRC32) of a file, read in chunks."""
    crc, size = 0, 0
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            crc = zlib.crc32(view[:n], crc)
            size += n
    return size, crc


@dataclass(frozen=True)
class Candidate:
    """A committed checkpoint directory whose manifest parses."""

    step: int
    path: Path
    manifest: dict[str, Any]


def read_manifest(path: Path) -> dict[str, Any]:
    body = read_json_checked(path / MANIFEST)
    if body.get("format") != FORMAT:
        raise Invalid(f"unknown format {body.get('format')!r}")
    for key in ("step", "world_size", "files"):
        if key not in body:
            raise Invalid(f"manifest lacks {key!r}")
    if METADATA not in body["files"]:
        raise Invalid("manifest lists no .metadata")
    return body


def list_candidates(root: Path) -> tuple[list[Candidate], list[tuple[Path, str]]]:
    """Committed checkpoints newest first, and (path, reason) for step dirs that are not valid."""
    good: list[Candidate] = []
    bad: list[tuple[Path, str]] = []
    try:
        entries = list(root.iterdir())
    except FileNotFoundError:
        return [], []
    for entry in entries:
        match = _STEP_DIR.match(entry.name)
        if not match or not entry.is_dir():
            continue
        try:
            manifest = read_manifest(entry)
            if manifest["step"] != int(match.group(1)):
                raise Invalid("manifest step does not match the directory name")
            good.append(Candidate(int(match.group(1)), entry, manifest))
        except Invalid as exc:
            bad.append((entry, str(exc)))
    good.sort(key=lambda c: c.step, reverse=True)
    return good, bad


def verify_files(
    path: Path, manifest: dict[str, Any], names: Iterable[str], *, full: bool
) -> str | None:
    """Check the given files against the manifest; None when they match, else the reason."""
    files = manifest["files"]
    for name in names:
        want = files[name]
        target = path / name
        try:
            size = target.stat().st_size
        except FileNotFoundError:
            return f"{name} is missing"
        if size != want["size"]:
            return f"{name} has {size} bytes, the manifest says {want['size']}"
        if full:
            _, crc = crc32_file(target)
            if crc != want["crc32"]:
                return f"{name} fails its CRC32 check"
    return None


def commit_dir(tmp: Path, final: Path) -> None:
    """Rename a complete, fsynced temp directory into place, replacing an older one of that name."""
    fsync_dir(tmp)
    trash = None
    if final.exists():
        trash = final.with_name(f"{_TRASH_PREFIX}{final.name}-{os.getpid()}-{time.monotonic_ns()}")
        os.rename(final, trash)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


def prune(root: Path, keep: int, *, current_tmp: Path | None = None) -> list[Path]:
    """Delete committed checkpoints beyond the newest `keep`, and stale temp/trash dirs.

    Best effort: the checkpoint just committed is durable whatever happens here, so a directory
    that vanished (another process pruned it) or cannot be removed is left for the next prune.
    """
    removed = []
    good, _ = list_candidates(root)
    for cand in good[keep:]:
        # Rename first: a process killed while deleting must not leave a half-deleted step-*.
        trash = root / f"{_TRASH_PREFIX}{cand.path.name}-{os.getpid()}-{time.monotonic_ns()}"
        try:
            os.rename(cand.path, trash)
        except OSError:
            continue
        shutil.rmtree(trash, ignore_errors=True)
        removed.append(cand.path)
    for entry in root.iterdir():
        stale = entry.name.startswith((_TMP_PREFIX, _TRASH_PREFIX))
        if stale and entry != current_tmp and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed
