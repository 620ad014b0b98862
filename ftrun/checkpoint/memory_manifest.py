"""A memory-tier snapshot's manifest: what it records, how it is written, how it is checked.

A slot's snapshot is `<name>.data` (the tensors, slot_file.py), `<name>.objects` (the sealed
pickle of the other values, auth.py) and `<name>.json`, its manifest: format, step, generation,
rank, world size, layout signature, sizes, the objects' CRC32, each tensor's entry, and the
sampled digest of the data (sample_digest.py) that a restore checks. The manifest carries the
checkpoint key's HMAC, so a snapshot that does not verify is skipped with a warning.

Integrity of a memory snapshot rests on ordering, not on a checksum of every byte (a CRC32 of
4.5 GiB would cost ~1 s of CPU per step): a slot's manifest is deleted before its data is
overwritten and written (temp + rename) only after the copy is complete, so a rank killed at any
moment leaves either a complete snapshot with a manifest or none.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import torch

from ftrun.checkpoint import auth, sample_digest, storage
from ftrun.checkpoint.slot_layout import TensorEntry

MEMORY_FORMAT = "ftrun-memory/1"


def write_manifest(
    manifest_path: Path,
    objects_path: Path,
    *,
    data: torch.Tensor | None,
    step: int,
    generation: int,
    rank: int,
    world_size: int,
    sig: str,
    entries: list[TensorEntry],
    objects: bytes,
    data_size: int,
    key: bytes,
) -> None:
    """Write the objects, then the manifest of the snapshot whose tensors are in `data` (temp +
    rename: the manifest is the commit). Not synced: tmpfs does not outlive the host anyway."""
    storage.write_file(objects_path, objects, sync=False)
    storage.write_json_atomic(
        manifest_path,
        {
            "format": MEMORY_FORMAT,
            "step": step,
            "generation": generation,
            "rank": rank,
            "world_size": world_size,
            "signature": sig,
            "data_size": data_size,
            "objects_size": len(objects),
            "objects_crc32": zlib.crc32(objects),
            "tensors": [[e.key, e.dtype, list(e.shape), e.offset, e.nbytes] for e in entries],
            # what restore checks the data against (sample_digest.py)
            "digest": sample_digest.compute(data, sample_digest.spans_of(entries)),
        },
        key=key,
        sync=False,
        compact=True,
    )


def read_manifest(path: Path, *, key: bytes) -> dict[str, Any]:
    """The manifest at `path`, authenticated and of this format (storage.Invalid otherwise)."""
    body = storage.read_json_checked(path, key=key)
    if body.get("format") != MEMORY_FORMAT:
        raise storage.Invalid("unknown format")
    return body


def manifest_entries(body: dict) -> list[TensorEntry]:
    """The tensors a memory manifest lists (write_manifest() writes them)."""
    return [TensorEntry(k, d, tuple(s), o, n) for k, d, s, o, n in body["tensors"]]


def verified_objects(body: dict, objects_path: Path, data_size: int, key: bytes) -> bytes:
    """The sealed objects of the snapshot whose (authenticated) manifest is `body`, after the
    data file (`data_size` bytes) and the objects file are checked against it."""
    if data_size < body["data_size"]:
        raise storage.Invalid("data file is short")
    objects = storage.read_regular(objects_path, private_file=True)
    if len(objects) != body["objects_size"] or zlib.crc32(objects) != body["objects_crc32"]:
        raise storage.Invalid("objects file does not match")
    auth.unseal(key, objects)
    return objects
