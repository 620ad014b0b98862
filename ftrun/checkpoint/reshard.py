"""Restore from this host's memory snapshots of any rank and layout (restore.py's last memory
candidate): the ranks' own and the replicas the peer copy keeps here (host_snapshots.py).

A shrink, a grow or a new DP x PP plan matches no snapshot of the rank's own tier; then each
rank looks for a (step, generation) whose snapshots on its host hold every tensor it needs, by
name, dtype and shape (in data parallel any old rank's snapshot holds them all; in a pipeline the
stages it now holds must have been on this host, or replicated to it). The newest one every rank
finds so is the candidate, loaded tensor by tensor from the mapped snapshots.

A restore names a step and is exactly that step, or it is not used. A rank's per-rank state (RNG,
PerRank entries) of a step is in one snapshot only, the one that rank wrote, so:

- the same layout (the step's snapshots were saved by as many ranks as there are now, and every
  rank's own snapshot of it that is here has its current signature): every rank must find its own
  snapshot of the step, or the step is not used. A restart in place lands here when no step is
  complete on every rank's own tier (a rank killed while its last copy ran, beside a rank whose
  third slot a persist pinned): another rank's snapshot holds the shared tensors, but taking it
  would give the rank whose own snapshot is missing fresh per-rank state under the step's name;
- another layout (another world size, or a rank's own snapshot of another signature: a new
  plan): per-rank state comes from the rank's own old snapshot where it holds every per-rank
  entry, else it starts fresh, as from storage under another world size, and rank 0 names the
  ranks whose per-rank state is not restored.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ftrun.checkpoint import auth, restore_check, slots
from ftrun.checkpoint.comm import Comm
from ftrun.checkpoint.errors import CheckpointError, warn
from ftrun.checkpoint.host_snapshots import HostSnapshot, scan_host
from ftrun.checkpoint.slot_layout import TensorEntry
from ftrun.checkpoint.state import Flat, TensorLeaf

SAME, OTHER, MISSING = "same", "other", "missing"  # a rank's own snapshot of a step


@dataclass(frozen=True)
class Candidate:
    """A step this rank can load from the host's snapshots; the same decision on every rank."""

    step: int
    generation: int
    snapshots: list[HostSnapshot]  # the sources, by old rank
    own: HostSnapshot | None  # this rank's own snapshot of the step, if here
    relayout: bool  # saved in another layout: per-rank state may start fresh


def candidates(
    keyed: list[tuple[str, TensorLeaf]],
    sig: str,
    tier: slots.MemoryTier,
    comm: Comm,
    mac_key: bytes,
    allowed: Callable[[int], bool],
) -> tuple[list[Candidate], list[str]]:
    """Collective: the steps every rank can load so, newest first, and why each step every rank
    could serve but the rules above refuse is not used (the same list on every rank). Each
    snapshot is checked first (its sampled digest), so a damaged one is passed over for another
    rank's or a replica of the same step; `allowed(step)` says whether a step may be restored."""
    assert tier.directory is not None
    found, rejected = scan_host(tier.directory.parent, key=mac_key)
    for message in rejected:
        warn(f"rank {comm.rank}: {message}")
    checked = []
    for snapshot in found:
        if why := restore_check.host_snapshots([snapshot], mac_key):
            warn(f"rank {comm.rank}: memory snapshot not used: {why}")
        else:
            checked.append(snapshot)
    by_step: dict[tuple[int, int], list[HostSnapshot]] = {}
    for snapshot in sorted(checked, key=lambda s: s.rank):  # each step's by old rank
        by_step.setdefault((snapshot.step, snapshot.generation), []).append(snapshot)
    needed = [(key, leaf.tensor) for key, leaf in keyed if not leaf.local]
    servable = {
        step: snapshots
        for step, snapshots in by_step.items()
        if needed
        and allowed(step[0])
        and all(source(key, t, snapshots) is not None for key, t in needed)
    }
    mine = {step: _facts(snapshots, sig, comm) for step, snapshots in servable.items()}
    every = comm.all_gather(mine)
    common = set.intersection(*(set(facts) for facts in every))
    out: list[Candidate] = []
    skipped: list[str] = []
    for key in sorted(common, reverse=True):
        owns = [facts[key][0] for facts in every]
        worlds = {w for facts in every for w in facts[key][1]}
        relayout = worlds != {comm.world} or OTHER in owns
        if not relayout and MISSING in owns:
            ranks = _ranges([r for r, own in enumerate(owns) if own == MISSING])
            skipped.append(
                f"the host's snapshot of step {key[0]} is not used: rank(s) {ranks} hold no "
                f"snapshot of their own of it, and the layout is the same ({comm.world} ranks), "
                "so their per-rank state (RNG, PerRank entries) would not be that step's"
            )
            continue
        snapshots = servable[key]
        out.append(Candidate(key[0], key[1], snapshots, _own(snapshots, comm), relayout))
    return out, skipped


def _own(snapshots: list[HostSnapshot], comm: Comm) -> HostSnapshot | None:
    return next((s for s in snapshots if (s.rank, s.world_size) == (comm.rank, comm.world)), None)


def _facts(snapshots: list[HostSnapshot], sig: str, comm: Comm) -> tuple[str, tuple[int, ...]]:
    """This rank's own snapshot of the step (SAME layout, OTHER layout or MISSING), and the world
    sizes the step was saved under."""
    own = _own(snapshots, comm)
    state = MISSING if own is None else SAME if own.signature == sig else OTHER
    return state, tuple(sorted({s.world_size for s in snapshots}))


def source(
    key: str, tensor: torch.Tensor, snapshots: list[HostSnapshot]
) -> tuple[HostSnapshot, TensorEntry] | None:
    """The first snapshot (they are in old rank order) with `key` of the tensor's dtype and
    shape, and its entry."""
    dtype, shape = str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape)
    for snapshot in snapshots:
        entry = snapshot.entries.get(key)
        if entry is not None and (entry.dtype, entry.shape) == (dtype, shape):
            return snapshot, entry
    return None


def load(
    flat: Flat,
    keyed: list[tuple[str, TensorLeaf]],
    candidate: Candidate,
    comm: Comm,
    mac_key: bytes,
) -> dict[str, Any]:
    """Load the tensors and the shared objects (the lowest rank's first, as from storage), and
    the per-rank state from this rank's own snapshot: always in the same layout (`candidates`
    made sure it is here), where it holds every per-rank entry in another layout, else it
    starts fresh."""
    snapshots, own = candidate.snapshots, candidate.own
    error, fresh = None, False
    merged: dict[str, Any] = {}
    try:
        if own is not None and not candidate.relayout:
            snapshots = [own, *(s for s in snapshots if s is not own)]  # its own bytes first
        local_keys = [(key, leaf.tensor) for key, leaf in keyed if leaf.local]
        fresh = own is None or any(source(k, t, [own]) is None for k, t in local_keys)
        if fresh and not candidate.relayout:
            raise CheckpointError(f"its own snapshot of step {candidate.step} lacks its state")
        with contextlib.ExitStack() as stack:
            views = {id(s): stack.enter_context(s.mapped()) for s in snapshots}
            for key, leaf in keyed:
                if leaf.local and fresh:
                    continue
                found = source(key, leaf.tensor, [own] if leaf.local and own else snapshots)
                assert found is not None  # candidates(), or `fresh`, made sure
                snapshot, entry = found
                leaf.tensor.copy_(views[id(snapshot)](entry))
        if changed := [str(s.manifest_path) for s in snapshots if not s.unchanged()]:
            raise CheckpointError(f"{changed[0]} changed while it was read")
        for snapshot in candidate.snapshots:  # sorted by rank
            for key, value in auth.loads(mac_key, snapshot.objects)["global"].items():
                merged.setdefault(key, value)
        if not fresh:
            assert own is not None
            merged.update(auth.loads(mac_key, own.objects)["local"])
        missing = [leaf.key for leaf in flat.objects if not leaf.local and leaf.key not in merged]
        if missing:
            error = f"rank {comm.rank}: the snapshot lacks {missing[0]!r}"
    except Exception as exc:  # noqa: BLE001 - every rank must learn that one failed
        error = f"rank {comm.rank}: {type(exc).__name__}: {exc}"
    reports = comm.all_gather((error, fresh))
    errors = [e for e, _ in reports if e]
    if errors:
        raise CheckpointError(
            f"loading the host's memory snapshot of step {candidate.step} failed: {errors[0]}",
            hint=f"delete {snapshots[0].manifest_path.parent.parent} to restore from storage",
        )
    started_fresh = [r for r, (_, f) in enumerate(reports) if f]
    if comm.rank == 0 and candidate.relayout:
        note = (
            f"; per-rank state (RNG, PerRank entries) of rank(s) {_ranges(started_fresh)} "
            "is not restored: it starts fresh"
            if started_fresh
            else ""
        )
        warn(
            f"step {candidate.step} is restored from host memory saved in another layout "
            f"({snapshots[0].world_size} ranks, now {comm.world}){note}"
        )
    return merged


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    out: list[str] = []
    for r in ranks:
        if out and out[-1].split("-")[-1] == str(r - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{r}"
        else:
            out.append(str(r))
    return ",".join(out)
