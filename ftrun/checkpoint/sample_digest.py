"""The memory tier's check at restore: a sampled XXH3 digest of what a snapshot's manifest claims.

A storage checkpoint is checked in full (digest.py: XXH3 of every byte, computed by the persist
worker as it writes). A memory snapshot cannot afford that: the live snapshot's point is that a
save copies nothing (live.py), and a full digest would read the whole state at every save. So
each memory manifest records the XXH3 of a sample of its data file, taken when the manifest is
written (the commit): the first and last 64-byte row of every tensor and one row every 64 KiB in
between. For 1 GiB of state that is ~17,000 rows, gathered by one `numpy.take` on one thread in
under a millisecond here (a page each: the cost is the rows, not their bytes).
The restore takes the same sample of the file it is about to load and compares.

What it catches: a snapshot whose tensors changed after its commit (a parameter updated in
place outside the fenced optimizer step: SAM's perturbation, EMA weights swapped in, a manual
update; an optimizer step killed half way; a step of a zombie rank): such updates touch every
element, so every row. A torn file (a copy or a peer's replica cut short, a slot overwritten
under its manifest), in pieces of 64 KiB or more. What it does not: a change confined to bytes
between the rows (a flipped bit in RAM, a sparse update of a few embedding rows). Those are the
storage tier's full checksums' to catch; host memory is trusted with them, as a running model is.

The sample is fixed by the layout (the entries' offsets and sizes), so it is computed once per
layout and reused save after save.
"""

from __future__ import annotations

import collections
import mmap
import os
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy
import torch
import xxhash

ALGORITHM = "xxh3-sampled/1"
ROW = 64  # bytes per sampled row; slot entries are 4 KiB-aligned (slot_layout.ALIGN): rows too
STRIDE = 64 << 10  # one row every this many bytes of a tensor
_CACHE: collections.OrderedDict[tuple[tuple[int, int], ...], torch.Tensor] = (
    collections.OrderedDict()
)
_CACHE_SIZE = 8

Span = tuple[int, int]  # (offset, nbytes) of one tensor in the data file


def rows(spans: Sequence[Span]) -> torch.Tensor:
    """The indexes of the 64-byte rows sampled for tensors at `spans` (cached per layout)."""
    key = tuple(spans)
    cached = _CACHE.get(key)
    if cached is not None:
        _CACHE.move_to_end(key)
        return cached
    parts = []
    for offset, nbytes in key:
        if nbytes <= 0:
            continue
        first, last = offset // ROW, (offset + nbytes - 1) // ROW
        parts.append(torch.arange(first, last + 1, STRIDE // ROW, dtype=torch.int64))
        parts.append(torch.tensor([last], dtype=torch.int64))
    index = torch.unique(torch.cat(parts)) if parts else torch.empty(0, dtype=torch.int64)
    _CACHE[key] = index
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return index


def spans_of(entries: Iterable[Any]) -> list[Span]:
    """(offset, nbytes) of each slot_layout.TensorEntry."""
    return [(e.offset, e.nbytes) for e in entries]


def compute(base: torch.Tensor | None, spans: Sequence[Span]) -> dict[str, Any]:
    """The manifest's record of the sample of `base` (a slot's bytes, uint8; None: an empty
    file) at `spans`."""
    if base is None:
        base = torch.empty(0, dtype=torch.uint8)
    index = rows(spans)
    need = (int(index[-1]) + 1) * ROW if len(index) else 0
    if base.numel() < need:
        raise ValueError(f"the data file holds {base.numel()} bytes, the manifest {need}")
    table = base[: base.numel() // ROW * ROW].view(-1, ROW)
    if base.numel() % ROW and need > table.numel():  # the last row is cut: pad a copy
        padded = torch.zeros(need, dtype=torch.uint8)
        padded[: base.numel()] = base
        table = padded.view(-1, ROW)
    # numpy's take runs on this thread: torch's index_select fans out to the intra-op threads,
    # which on a busy machine costs more in waiting for them than the gather itself.
    sample = numpy.take(table.numpy(), index.numpy(), axis=0)
    value = xxhash.xxh3_64_intdigest(sample.data) if len(index) else 0
    return {
        "algorithm": ALGORITHM,
        "row": ROW,
        "stride": STRIDE,
        "rows": len(index),
        "value": value,
    }


def mismatch(base: torch.Tensor | None, spans: Sequence[Span], want: Any) -> str | None:
    """Why `base` does not match the manifest's `digest` record, or None when it does."""
    if not isinstance(want, dict):
        return "has no digest in its manifest"
    if want.get("algorithm") != ALGORITHM or (want.get("row"), want.get("stride")) != (
        ROW,
        STRIDE,
    ):
        return f"has a digest of an unknown kind ({want.get('algorithm')!r})"
    try:
        got = compute(base, spans)
    except ValueError as exc:
        return f"is torn: {exc}"
    if got["value"] != want.get("value") or got["rows"] != want.get("rows"):
        return "fails its digest check: the data changed after its manifest was written"
    return None


def file_mismatch(path: Path, spans: Sequence[Span], want: Any) -> str | None:
    """mismatch() for a data file not mapped here (a snapshot of another rank, a replica)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ) if size else None
    finally:
        os.close(fd)
    if mm is None:
        return mismatch(torch.empty(0, dtype=torch.uint8), spans, want)
    try:
        with warnings.catch_warnings():  # "not writable": read-only is the point
            warnings.simplefilter("ignore", UserWarning)
            base = torch.frombuffer(mm, dtype=torch.uint8)
        why = mismatch(base, spans, want)
        del base
        return why
    finally:
        try:
            mm.close()
        except BufferError:  # a view escaped: the GC unmaps it
            pass
