"""The storage tier on disk: directory names, manifests, verification, atomic commit, pruning.

Pure Python (no torch): the persist worker imports it, and it starts in milliseconds.

Layout of a checkpoint directory:

    <dir>/step-0000000040/          committed (renamed into place only when complete)
        manifest.json               format, step, generation, world size, every file's size + checksum
        .metadata                   torch.distributed.checkpoint Metadata (sealed pickle), for resharding
        __<r>_0.distcp              raw tensor bytes written by rank r (offsets in .metadata)
        __<r>_objects.pkl           rank r's non-tensor state (sealed pickle)
    <dir>/.tmp-step-...-g<G>-<id>/  being written; never read; removed by the next commit

A commit is: every rank writes and fsyncs its files and a `part-<r>.json`, then rank 0 writes and
fsyncs `.metadata` and `manifest.json`, fsyncs the directory, renames it to `step-<N>` and fsyncs
the parent. Anything without a valid manifest is not a checkpoint.

Who can touch it: the directories this module makes are 0700 (a missing storage root and its
missing parents too) and its files 0600, each made fresh with O_EXCL | O_NOFOLLOW, so a link
planted where a file goes is removed, never written through. Every JSON file carries an HMAC
under the checkpoint key besides its CRC32, and the pickles are sealed (auth.py): a checkpoint
another user planted or altered fails verification and is skipped like a corrupt one. An existing
storage root is the user's choice and is not refused for its mode; a co-writer of it can delete
checkpoints, never make a rank run code or write through a link.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftrun import private
from ftrun.checkpoint import auth, digest
from ftrun.checkpoint.errors import CheckpointDirError, UnsafePathError

FORMAT = "ftrun-checkpoint/1"
MANIFEST = "manifest.json"
METADATA = ".metadata"
CHUNK = 8 << 20
_STEP_DIR = re.compile(r"^step-(\d{10})$")
_TMP_PREFIX = ".tmp-step-"
_TRASH_PREFIX = ".trash-"
_OBJECTS_FILE = re.compile(r"^__\d+_objects\.pkl$")
MAX_JSON_BYTES = 64 << 20  # a manifest lists two files per rank: far below this


class Invalid(Exception):
    """A checkpoint (or memory snapshot) that must not be loaded; the message says why."""


def prepare_directory(path: Path) -> None:
    """Create the storage directory if needed; a user error if it cannot be written to."""
    try:
        private.make_dirs(path)  # 0700, and so are the parents it makes
        if not path.is_dir():
            raise FileExistsError
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


def sealed(name: str) -> bool:
    """The files of a checkpoint that hold pickles, sealed with the checkpoint key (auth.py)."""
    return name == METADATA or bool(_OBJECTS_FILE.match(name))


def canonical_crc(body: dict[str, Any]) -> int:
    """CRC32 of a JSON body in canonical form (sorted keys, no spaces), stored next to it."""
    return zlib.crc32(auth.canonical(body))


def private_subdir(path: Path) -> None:
    """Make a directory of this job's (0700; several ranks may race to make it) and refuse one
    that another user made or can write to."""
    private.ensure_dir(
        path,
        forbid=private.GROUP_OTHER_WRITE,
        what="checkpoint directory",
        hint="another user may have planted it: remove it, or checkpoint to a directory only "
        "you can write",
        error=UnsafePathError,
    )


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_file(path: Path, flags: int = 0) -> int:
    """A new, empty file at path (mode 0600), open for writing. Whatever was there (a stale file,
    a link another user planted) is unlinked first, never followed or truncated."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return os.open(
        path,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC | flags,
        0o600,
    )


def write_file(path: Path, data: bytes, *, sync: bool = True) -> int:
    """Write bytes to a new file at path (create_file; fsynced when sync); returns their CRC32."""
    fd = create_file(path)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return zlib.crc32(data)


def write_json_atomic(
    path: Path, body: dict[str, Any], *, key: bytes, sync: bool = True, compact: bool = False
) -> None:
    """Write `body` plus its CRC32 and its HMAC under `key` to a temp file, then rename it over
    path. `compact`: on one line, for a file no person reads (a memory snapshot's manifest,
    written at every save: json's indenting encoder is pure Python, ~10x slower)."""
    canonical = auth.canonical(body)
    doc = dict(body, crc32=zlib.crc32(canonical), hmac=auth.canonical_tag(key, canonical))
    text = json.dumps(
        doc, sort_keys=True, **({"separators": (",", ":")} if compact else {"indent": 1})
    )
    tmp = path.with_name(path.name + ".tmp")
    write_file(tmp, text.encode(), sync=sync)
    os.replace(tmp, path)


def read_json_checked(path: Path, *, key: bytes) -> dict[str, Any]:
    """Read a JSON file written by write_json_atomic; Invalid if missing, torn, altered or not
    authenticated by `key` (planted, or written under another job's key)."""
    try:
        doc = json.loads(read_regular(path, limit=MAX_JSON_BYTES))
    except FileNotFoundError:
        raise Invalid(f"{path.name} is missing") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise Invalid(f"{path.name} is unreadable ({exc})") from None
    if not isinstance(doc, dict) or "crc32" not in doc:
        raise Invalid(f"{path.name} has no checksum")
    body = {k: v for k, v in doc.items() if k not in ("crc32", "hmac")}
    if canonical_crc(body) != doc["crc32"]:
        raise Invalid(f"{path.name} fails its checksum")
    if not auth.json_authentic(key, body, doc.get("hmac")):
        raise Invalid(f"{path.name} is not authenticated by this job's checkpoint key")
    return body


def read_regular(path: Path, *, limit: int | None = None, private_file: bool = False) -> bytes:
    """The bytes of a regular file, opened without following a link (a FIFO or a device planted
    in its place would block or never end). `limit`: refuse a larger file. `private_file`: also
    refuse one that is not this user's alone (the memory tier's files)."""
    fd = open_regular(path)
    try:
        st = os.fstat(fd)
        if private_file and private.problem(st, directory=False, forbid=0o077):
            raise Invalid(f"{path.name} is not this user's alone ({private.describe(st)})")
        if limit is not None and st.st_size > limit:
            raise Invalid(f"{path.name} has {st.st_size} bytes, more than {limit}")
        chunks = []
        while chunk := os.read(fd, CHUNK):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def open_regular(path: Path) -> int:
    """An fd of the regular file at path, read-only, opened without following a link and without
    blocking (a FIFO planted there would block a plain open); Invalid for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise Invalid(f"{path.name} cannot be opened ({exc.strerror or exc})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Invalid(f"{path.name} is not a regular file")
    return fd


@dataclass(frozen=True)
class Candidate:
    """A committed checkpoint directory whose manifest parses."""

    step: int
    path: Path
    manifest: dict[str, Any]


def read_manifest(path: Path, *, key: bytes) -> dict[str, Any]:
    body = read_json_checked(path / MANIFEST, key=key)
    if body.get("format") != FORMAT:
        raise Invalid(f"unknown format {body.get('format')!r}")
    for field in ("step", "world_size", "files"):
        if field not in body:
            raise Invalid(f"manifest lacks {field!r}")
    if METADATA not in body["files"]:
        raise Invalid("manifest lists no .metadata")
    return body


def list_candidates(root: Path, *, key: bytes) -> tuple[list[Candidate], list[tuple[Path, str]]]:
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
            manifest = read_manifest(entry, key=key)
            if manifest["step"] != int(match.group(1)):
                raise Invalid("manifest step does not match the directory name")
            good.append(Candidate(int(match.group(1)), entry, manifest))
        except Invalid as exc:
            bad.append((entry, str(exc)))
    good.sort(key=lambda c: c.step, reverse=True)
    return good, bad


def verify_files(
    path: Path, manifest: dict[str, Any], names: Iterable[str], *, full: bool, key: bytes
) -> str | None:
    """Check the given files against the manifest; None when they match, else the reason.

    Sizes always, checksums (digest.py) when `full`; the seal of a pickled file always
    (auth.py), whatever `full` says: a pickle is never loaded on the strength of a checksum."""
    files = manifest["files"]
    for name in names:
        want = files[name]
        target = path / name
        try:
            st = os.lstat(target)
        except FileNotFoundError:
            return f"{name} is missing"
        if not stat.S_ISREG(st.st_mode):
            return f"{name} is not a regular file"
        if st.st_size != want["size"]:
            return f"{name} has {st.st_size} bytes, the manifest says {want['size']}"
        try:
            if sealed(name):
                auth.unseal(key, read_regular(target))
            elif full and (why := digest.mismatch(open_regular(target), want)):
                return f"{name} {why}"
        except FileNotFoundError:
            return f"{name} is missing"
        except (Invalid, OSError) as exc:
            return f"{name} is unreadable ({exc})"
        except auth.NotAuthentic as exc:
            return f"{name} is not authenticated: {exc}"
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


def prune(root: Path, keep: int, *, key: bytes, current_tmp: Path | None = None) -> list[Path]:
    """Delete committed checkpoints beyond the newest `keep`, and stale temp/trash dirs.

    Best effort: the checkpoint just committed is durable whatever happens here, so a directory
    that vanished (another process pruned it) or cannot be removed is left for the next prune.
    """
    removed = []
    good, _ = list_candidates(root, key=key)
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
