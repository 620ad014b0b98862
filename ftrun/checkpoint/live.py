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

from ftrun.checkpoint import sample_digest
from ftrun.checkpoint.slot_file import Slot
from ftrun.checkpoint.slot_layout import SlotLayout, TensorEntry
from ftrun.checkpoint.slots import MemoryTier
from ftrun.checkpoint.snapshot_meta import SnapshotMeta
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


Span = tuple[int, int]  # [start, end) addresses of a live file's mapping


def owners(roots: Iterable[Any], ours: Span | None = None) -> dict[int, list[Setter]]:
    """Where each adoptable tensor of the TrainStates among `roots` is held, by address: the
    functions that point its holder at a new tensor. Buffers are left out (see above). `ours`:
    the mapping of a live file the tensors may already be in (adoptable())."""
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


def adoptable(t: torch.Tensor, ours: Span | None = None) -> bool:
    """A plain dense CPU tensor that is its storage's only tenant, or one in the live file
    mapped at `ours` (a layout that changed moves into a new file)."""
    if not (
        type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.device.type == "cpu"
        and t.layout == torch.strided
        and t.numel() > 0
        and t.is_contiguous()
    ):
        return False
    storage = t.untyped_storage()
    if ours is not None and _within(storage.data_ptr(), ours):
        return True
    return (
        t._base is None
        and t.storage_offset() == 0
        and storage.nbytes() == t.numel() * t.element_size()
    )


def _within(ptr: int, span: Span) -> bool:
    return span[0] <= ptr < span[1]


def own_view(slot: Slot, entry: TensorEntry) -> torch.Tensor:
    """The tensor `entry` describes in the slot's file, over a storage of its own that spans its
    bytes alone: `torch.save` of it (a user's own `state_dict()` export) writes the tensor, not
    the whole file, which a view of the slot's one storage would."""
    assert slot.mm is not None
    raw = torch.frombuffer(slot.mm, dtype=torch.uint8, count=entry.nbytes, offset=entry.offset)
    dtype = getattr(torch, entry.dtype)
    stride: list[int] = []
    n = 1
    for dim in reversed(entry.shape):
        stride.insert(0, n)
        n *= dim
    return torch.empty(0, dtype=dtype).set_(raw.untyped_storage(), 0, entry.shape, stride)


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
    is on file (written by save(), on the training thread).

    The guard (issue 33): between a commit and the optimizer's pre-step hook the file must not
    change. The `_version` counter of every tensor kept live (the parameter objects and the
    optimizer's state tensors) is recorded at the commit and compared at each forward pass of
    a TrainState's model (a pre-hook), at the pre-step hook, at the next save and at close():
    an in-place change through them, or through a view or `detach()` of them (they share the
    counter), is seen there. A write through `p.data` (a tensor with a counter of its own), a
    NumPy view or any other alias of the file's bytes is not; for those the same moments compare
    the sampled digest of the live tensors' bytes (sample_digest.py: the first and last 64-byte
    row of each, one every 64 KiB between; ~1 ms per GiB) with the commit's, which sees any
    change of a whole tensor, not one confined to the bytes between the rows. Either way the
    manifest is retracted for good (`disabled`) and the Manager's guard (guard.py) copies the
    state at every save from then on; see docs/checkpoint.md, *Live snapshot*."""

    slot: Slot
    sig: str
    keys: frozenset[str]
    span: Span  # the addresses of the file's mapping the tensors were moved into
    roots: list[TrainState]  # whose tensors moved
    tier: MemoryTier
    committed: bool = False
    last: SnapshotMeta | None = field(default=None, repr=False)  # what the live manifest says
    watched: list[tuple[str, torch.Tensor]] = field(default_factory=list, repr=False)
    versions: list[int] = field(default_factory=list, repr=False)  # at the last commit
    spans: list[tuple[int, int]] = field(default_factory=list, repr=False)  # kept live
    sample: int = 0  # their sampled digest at the last commit (sample_digest.py)
    disabled: str | None = None  # why the live manifest is no longer used (the guard)
    hooks: list[Any] = field(default_factory=list, repr=False)
    on_change: Callable[[str], None] | None = None  # the Manager's guard (guard.py)

    @classmethod
    def adopt(
        cls,
        tier: MemoryTier,
        keyed: list[tuple[str, torch.Tensor]],
        layout: SlotLayout,
        roots: list[TrainState],
        previous: LiveSnapshot | None = None,
    ) -> LiveSnapshot | None:
        """Move the adoptable tensors of `keyed` into a fresh live file laid out as `layout`
        (from `previous`'s file too); None when none can move (then every save copies, as
        without a live snapshot)."""
        slot = tier.live
        if slot is None or layout.size < MIN_BYTES:
            return None
        ours = previous.span if previous is not None else None
        held = owners(roots, ours)
        chosen: list[tuple[torch.Tensor, TensorEntry, list[Setter]]] = []
        taken: set[int] = set()
        for (_, t), entry in zip(keyed, layout.entries, strict=True):
            ptr = t.data_ptr()
            setters = held.get(ptr)
            if setters and ptr not in taken and adoptable(t, ours):
                taken.add(ptr)  # a tensor saved under two names moves once
                chosen.append((t, entry, setters))
        if not chosen:
            return None
        tier.invalidate(tier.live_index)
        slot.renew()
        slot.ensure(layout.size)
        slot.populate()
        slot.lent = True
        assert slot.base is not None
        start = slot.base.data_ptr()
        for t, entry, setters in chosen:
            view = own_view(slot, entry)
            view.copy_(t)
            for point in setters:
                point(view)
        snap = cls(
            slot,
            layout.sig,
            frozenset(e.key for _, e, _ in chosen),
            (start, start + slot.size),
            roots,
            tier,
        )
        names = {start + e.offset: e.key for _, e, _ in chosen}
        snap.watched = [
            (names.get(t.data_ptr(), "?"), t)
            for t, _ in _holders(roots)
            if _within(t.data_ptr(), snap.span)
        ]
        for obj in roots:  # the first forward pass after a change is the last moment to see it
            snap.hooks.append(obj.model.register_forward_pre_hook(snap.forward_check))
        return snap

    def forward_check(self, *_: Any) -> None:
        self.check()  # (a forward pre-hook that returns something replaces the input)

    def holds(self, keyed: list[tuple[str, torch.Tensor]], entries: list[TensorEntry]) -> bool:
        """Whether the tensors kept live are still the slot's: `model.to()`, or an optimizer's
        `load_state_dict`, gives a parameter or a state entry new storage, which then must move
        in again (or the live snapshot would hold their old values)."""
        return all(
            t.data_ptr() == self.span[0] + e.offset
            for (_, t), e in zip(keyed, entries, strict=True)
            if e.key in self.keys
        )

    def committed_as(self, meta: SnapshotMeta) -> None:
        """The live manifest of `meta` is on file: from now on the tensors must not change."""
        self.last = meta
        self.versions = [t._version for _, t in self.watched]
        self.spans = sample_digest.spans_of(e for e in meta.layout.entries if e.key in self.keys)
        self.sample = sample_digest.compute(self.slot.base, self.spans)["value"]
        self.committed = True

    def check(self) -> bool:
        """The guard: False once a tensor kept live changed since the commit (see the class
        doc), after retracting the manifest and turning the live snapshot off."""
        if self.disabled is not None:
            return False
        if not self.committed:
            return True
        step = self.last.step if self.last is not None else None
        for (name, t), version in zip(self.watched, self.versions, strict=True):
            if t._version != version:
                self.disable(
                    f"{name} changed outside the optimizer step after the save of step {step}"
                )
                return False
        if sample_digest.compute(self.slot.base, self.spans)["value"] != self.sample:
            self.disable(  # not through the tensors: `p.data`, NumPy (see the class doc)
                f"the live file changed outside the optimizer step after the save of step {step}"
            )
            return False
        return True

    def disable(self, why: str) -> None:
        """Retract the live manifest for good: every save copies from now on (on_change)."""
        self.retract()
        self.disabled = why
        self.unhook()
        if self.on_change is not None:
            self.on_change(why)

    def give_back(self) -> None:
        """close(): move the tensors out of the file, into the rank's heap again. The file is
        the tier's (deleted at job end), and a later Manager adopts them afresh."""
        self.unhook()
        with torch.no_grad():
            for t, point in _holders(self.roots):
                if _within(t.untyped_storage().data_ptr(), self.span):
                    point(t.detach().clone())
        for obj in self.roots:  # its cache holds aliases of the tensors in the file
            obj.forget_cache()

    def unhook(self) -> None:
        for handle in self.hooks:
            handle.remove()
        self.hooks.clear()

    def retract(self) -> None:
        """The state is about to change: the live file no longer holds a snapshot."""
        if self.committed:
            self.committed = False
            self.tier.invalidate(self.tier.live_index)
