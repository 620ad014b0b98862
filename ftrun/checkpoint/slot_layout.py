"""Where each tensor of a rank's state sits in a snapshot buffer (a slot, slot_file.py).

Tensors lie back to back, each at an ALIGN-aligned offset, so the persist worker can write them
to storage with O_DIRECT straight from the slot (direct_write.py). A layout's signature names
it: the same keys, dtypes and shapes on the same world size. A snapshot is restored into the
state as it lies only when the signatures agree (restore.py); another one is resharded.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import torch

ALIGN = 4096  # O_DIRECT-friendly: the worker writes straight from the slot


@dataclass(frozen=True)
class TensorEntry:
    key: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class SlotLayout:
    """The entries of one save's tensors, the bytes they span (padded) and the signature."""

    entries: list[TensorEntry]
    size: int
    sig: str

    @classmethod
    def of(cls, tensors: list[tuple[str, torch.Tensor]], world_size: int) -> SlotLayout:
        entries, size = layout(tensors)
        return cls(entries, size, signature(entries, world_size))


def layout(tensors: list[tuple[str, torch.Tensor]]) -> tuple[list[TensorEntry], int]:
    """Place tensors back to back, ALIGN-aligned; returns the entries and the padded total size."""
    entries, offset = [], 0
    for key, t in tensors:
        offset = (offset + ALIGN - 1) // ALIGN * ALIGN
        nbytes = t.numel() * t.element_size()
        entries.append(
            TensorEntry(key, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, nbytes)
        )
        offset += nbytes
    return entries, (offset + ALIGN - 1) // ALIGN * ALIGN  # the padded tail of the last one too


def signature(entries: list[TensorEntry], world_size: int) -> str:
    """Identifies a layout: the same keys, dtypes and shapes on the same world size."""
    spec = [(e.key, e.dtype, e.shape) for e in entries] + [world_size]
    return hashlib.sha1(json.dumps(spec).encode()).hexdigest()


def entry_view(base: torch.Tensor, entry: TensorEntry) -> torch.Tensor:
    """The tensor `entry` describes, as a view of the slot's bytes `base`."""
    raw = base[entry.offset : entry.offset + entry.nbytes]
    return raw.view(getattr(torch, entry.dtype)).view(entry.shape)


class LayoutCache:
    """The layout of a save's tensors: the last save's while their names, dtypes and shapes are
    the same (they are, save after save), made again only when they change."""

    def __init__(self, world_size: int) -> None:
        self._world_size = world_size
        self._last: tuple[list[tuple[str, torch.dtype, torch.Size]], SlotLayout] | None = None

    def __call__(self, tensors: list[tuple[str, torch.Tensor]]) -> SlotLayout:
        key = [(name, t.dtype, t.shape) for name, t in tensors]
        if self._last is None or self._last[0] != key:
            self._last = (key, SlotLayout.of(tensors, self._world_size))
        return self._last[1]
