"""The live snapshot: the training state kept in the memory tier's own file, so that a snapshot
of every step copies next to nothing.

Parameters and optimizer state change only inside `optimizer.step()`: the rule the background
copy rests on (snapshot.py). So from one save() to the next optimizer step, the tensors
themselves hold the saved step's state. Kept in a shared-memory file of the tier (`live.data`),
they are that step's snapshot as they stand: save() commits a manifest for them (after copying
in the few tensors that are not kept there), and the optimizer's pre-step hook deletes that
manifest before the step changes them. A rank killed in between (a crash in the forward pass,
a kill while it waits in a collective for a lost peer) restores the step it saved, from that
file, as from any slot; the file outlives the process as the slots do.

What moves into the file ("adoption", at the first save, when the state is MIN_BYTES or more;
again when the layout changes or a tensor got new storage): each parameter of a `TrainState`'s
model and each tensor of its optimizers' state, by swapping the tensor's storage
(`param.data = view`, `state[key] = view`), so every holder of the parameter object sees it.
Only plain, dense, contiguous CPU tensors that own their whole storage move: a view of a bigger
buffer would leave the buffer behind. Buffers stay where they are and are copied at each save,
since a forward pass updates them (BatchNorm statistics). GPU state is snapshot by the copy
engine instead (device_copy.py). Training is as fast on the file as on private memory (both are
4 KiB pages here; measured in scripts/bench_throughput.py).

A rank killed inside an optimizer step leaves the file torn and without a manifest: its restore
takes the newest full copy in the slots. The Manager makes one every `full_copy_every()`
saves, as often as a share of the step time (`FULL_COPY_BUDGET`) pays for, so that fallback is a
few steps old; a persisted save is always a full copy (the worker reads a slot while training
goes on).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from ftrun.checkpoint.slots import MemoryTier, Slot, TensorEntry
from ftrun.checkpoint.state import TrainState

# A state smaller than this is copied at every save: its copy takes a few ms of one core at
# most, less than a fallback more than one step old would cost (see the module doc).
MIN_BYTES = 16 << 20
# Full copies may take this share of the training time; the measured cost of the last one and
# the time per save set how many saves apart they are (full_copy_every).
FULL_COPY_BUDGET = 0.02
MAX_FULL_COPY_EVERY = 1000


def full_copy_every(held_s: float, save_interval_s: float) -> int:
    """Saves between full copies so that they cost at most FULL_COPY_BUDGET of the time, from how
    long the last one held the optimizer step up: 1 when it cost training nothing (the copy hid
    in idle time: a GPU job's cores, ranks waiting in collectives), more when it did."""
    if held_s <= 0 or save_interval_s <= 0:
        return 1
    every = math.ceil(held_s / (FULL_COPY_BUDGET * save_interval_s))
    return max(1, min(MAX_FULL_COPY_EVERY, every))


Setter = Callable[[torch.Tensor], None]


def owners(roots: Iterable[Any], ours: int | None = None) -> dict[int, list[Setter]]:
    """Where each adoptable tensor of the TrainStates among `roots` is held, by address: the
    functions that point its holder at a new tensor. Buffers are left out (see above). `ours`:
    the storage of a live file the tensors may already be in (adoptable())."""
    found: dict[int, list[Setter]] = defaultdict(list)
    for t, point in _holders(roots):
        if adoptable(t, ours):
            found[t.data_ptr()].append(point)
    return found


def _holders(roots: Iterable[Any]) -> list[tuple[torch.Tensor, Setter]]:
    """Each parameter and optimizer state tensor of the TrainStates among `roots`, once, with
    the function that points its holder at another tensor."""
    found: list[tuple[torch.Tensor, Setter]] = []
    seen: set[int] = set()
    for obj in roots:
        if not isinstance(obj, TrainState):
            continue
        for p in obj.model.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                found.append((p, _param_setter(p)))
        for opt in obj.optimizers:
            for state in opt.state.values():
                for key, value in list(state.items()):
                    if isinstance(value, torch.Tensor) and id(value) not in seen:
                        seen.add(id(value))
                        found.append((value, _dict_setter(state, key)))
    return found


def adoptable(t: torch.Tensor, ours: int | None = None) -> bool:
    """A plain dense CPU tensor that is its storage's only tenant, or one in the live file
    whose storage is `ours` (a layout that changed moves into a new file)."""
    if not (
        type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.device.type == "cpu"
        and t.layout == torch.strided
        and t.numel() > 0
        and t.is_contiguous()
    ):
        return False
    storage = t.untyped_storage()
    if ours is not None and storage.data_ptr() == ours:
        return True
    return (
        t._base is None
        and t.storage_offset() == 0
        and storage.nbytes() == t.numel() * t.element_size()
    )


def _param_setter(p: torch.Tensor) -> Setter:
    def point(view: torch.Tensor) -> None:
        p.data = view

    return point


def _dict_setter(holder: dict[str, Any], key: str) -> Setter:
    def point(view: torch.Tensor) -> None:
        holder[key] = view

    return point


@dataclass
class LiveSnapshot:
    """The tensors of one layout (`sig`) adopted into the tier's live slot. `keys` are the
    entries the slot holds live; save() copies the others in. `committed`: the live manifest
    is on file (set by the snapshot thread, read by the training thread after the job's done)."""

    slot: Slot
    sig: str
    keys: frozenset[str]
    storage: int  # the address of the file's mapping the tensors were moved into
    roots: list[TrainState]  # whose tensors moved
    committed: bool = False
    # What the live manifest on file says: (step, layout signature, entries, objects, size).
    last: tuple[int, str, list[TensorEntry], bytes, int] | None = field(default=None, repr=False)

    @classmethod
    def adopt(
        cls,
        tier: MemoryTier,
        keyed: list[tuple[str, torch.Tensor]],
        entries: list[TensorEntry],
        size: int,
        sig: str,
        roots: list[TrainState],
        previous: LiveSnapshot | None = None,
    ) -> LiveSnapshot | None:
        """Move the adoptable tensors of `keyed` into a fresh live file laid out as `entries`
        (from `previous`'s file too); None when none can move (then every save copies, as
        without a live snapshot)."""
        slot = tier.live
        if slot is None or size < MIN_BYTES:
            return None
        ours = previous.storage if previous is not None else None
        held = owners(roots, ours)
        chosen: list[tuple[torch.Tensor, TensorEntry, list[Setter]]] = []
        taken: set[int] = set()
        for (_, t), entry in zip(keyed, entries, strict=True):
            ptr = t.data_ptr()
            setters = held.get(ptr)
            if setters and ptr not in taken and adoptable(t, ours):
                taken.add(ptr)  # a tensor saved under two names moves once
                chosen.append((t, entry, setters))
        if not chosen:
            return None
        tier.invalidate(tier.live_index)
        slot.renew()
        slot.ensure(size)
        slot.populate()
        slot.lent = True
        assert slot.base is not None
        storage = slot.base.untyped_storage().data_ptr()
        for t, entry, setters in chosen:
            view = slot.view(entry)
            view.copy_(t)
            for point in setters:
                point(view)
        return cls(slot, sig, frozenset(e.key for _, e, _ in chosen), storage, roots)

    def holds(self, keyed: list[tuple[str, torch.Tensor]], entries: list[TensorEntry]) -> bool:
        """Whether the tensors kept live are still the slot's: `model.to()`, or an optimizer's
        `load_state_dict`, gives a parameter or a state entry new storage, which then must move
        in again (or the live snapshot would hold their old values)."""
        return all(
            t.data_ptr() == self.storage + e.offset
            for (_, t), e in zip(keyed, entries, strict=True)
            if e.key in self.keys
        )

    def give_back(self) -> None:
        """close(): move the tensors out of the file, into the rank's heap again. The file is
        the tier's (deleted at job end), and a later Manager adopts them afresh."""
        with torch.no_grad():
            for t, point in _holders(self.roots):
                if t.untyped_storage().data_ptr() == self.storage:
                    point(t.detach().clone())
        for obj in self.roots:  # its cache holds aliases of the tensors in the file
            obj.forget_cache()

    def retract(self, tier: MemoryTier) -> None:
        """The state is about to change: the live file no longer holds a snapshot."""
        if self.committed:
            self.committed = False
            tier.invalidate(tier.live_index)
