"""What one save's snapshot is, besides its tensors' bytes: the step, the layout, the objects.

The Manager makes one per save and hands it whole to whatever commits the snapshot: the copy
path once the snapshot thread has copied the tensors into a slot (copy_path.py), the live path
once the tensors in the live file are the step (live_path.py). The live snapshot keeps the one
its manifest says, so that close() can copy that step into a slot (live.py). A slot's manifest
records the same fields (MemoryTier.commit).
"""

from __future__ import annotations

from dataclasses import dataclass

from ftrun.checkpoint.slot_layout import SlotLayout


@dataclass(frozen=True)
class SnapshotMeta:
    step: int
    layout: SlotLayout  # where each tensor lies in the slot, the bytes they span, the signature
    objects: bytes  # the sealed pickle of the state's values that are not tensors (auth.py)
