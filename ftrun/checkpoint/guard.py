"""The guard: a snapshot is exactly the step it names, or it is not used (issue 33).

A snapshot rests on one rule: the saved tensors do not change from save() until the snapshot is
complete: until the background copy into a slot is done (snapshot.py), or, for the live snapshot
(live.py), until the next optimizer step's pre-step hook takes its manifest back. SAM's first
pass, an EMA's weights swapped in for an evaluation, an update written by hand, a buffer over
`small_tensor_bytes` that the forward pass updates: each breaks it, and the snapshot would hold
a mix of the saved step and the change under the saved step's name.

What is seen, cheaply: every tensor has a `_version` counter that each in-place operation on
it, or on a view or `detach()` of it, increments (`torch/csrc/autograd/variable.h`). The guard
records the counters of the saved tensors at save() and compares them where the snapshot is
completed: as the last chunk of a copy lands (before the optimizer step may run), and for the
live snapshot at each forward pass, at the pre-step hook, at the next save and at close(). What
is not seen: a write through `p.data` (a tensor with a counter of its own, new at each access),
a NumPy view, or any other alias of the bytes. docs/checkpoint.md says so.

A change seen: that snapshot is not committed (a copy) or its manifest is taken back (live), and
from then on every save copies the state before it returns (the training thread helps), so no
later change can reach a snapshot; the rank warns once, one line, and tells the agent (a
`tier` event: the journal's record of why).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from ftrun import runtime
from ftrun.checkpoint.restore import warn

Changed = Callable[[], "str | None"]


def versions(tensors: Iterable[tuple[str, torch.Tensor]]) -> Changed:
    """A check of `tensors`' version counters as they are now: it returns the name of the first
    one changed since, or None. ~0.1 us a tensor."""
    watched = [(name, t, t._version) for name, t in tensors]

    def changed() -> str | None:
        for name, t, version in watched:
            if t._version != version:
                return name
        return None

    return changed


class Guard:
    """Whether this rank's saves must copy before they return, and why: set once, by the first
    change seen (from the training thread or the snapshot thread), reported once."""

    def __init__(self, *, rank: int) -> None:
        self.rank = rank
        self.why: str | None = None

    @property
    def tripped(self) -> bool:
        return self.why is not None

    def trip(self, why: str, *, before: str = "copies") -> None:
        """`before`: the level the snapshots were at (capacity.Level's names): `live` when the
        live snapshot saw the change, else `copies` (copies from now on made inside save())."""
        if self.why is not None:
            return
        self.why = why
        warn(f"every save now copies the state before it returns: {why}")
        runtime.checkpoint_tier("copies", before, why, need=-1, free=-1, total=-1)
