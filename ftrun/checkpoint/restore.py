"""Restore: pick the freshest valid tier that every rank can load, load it, and say so.

All ranks agree on one step:
- memory: each rank lists the steps its memory slots hold for the current layout; the newest step
  every rank holds is the memory candidate;
- storage: rank 0 lists committed checkpoints (manifests); each one newer than the memory
  candidate is verified (sizes + checksums, the files split across ranks) until one passes; a
  torn or corrupt one is skipped with a warning.
The newer of the two wins (memory on a tie: it is faster). Every rank prints the choice as one
line, `ftrun-checkpoint: restored step N from <tier>` (or `... no checkpoint found, starting from
step 0`): under ftrun the agent relays rank output into the job's logs, where `ftrun inspect`
reads it (ftrun/jobview.py), so no new message kind is needed.

When the layout changed (a shrink, a grow, another DP x PP plan) no memory snapshot matches
it; then each rank looks at every snapshot its host's memory holds, of any rank and layout, its
own ranks' and the replicas the peer copy keeps here (slots.scan_host), for one step that has
every tensor it needs, by name, dtype and shape (in a data-parallel job any old rank's snapshot
has them all; in a pipeline the stages it now holds must have been on this host, or replicated
to it). The newest step that every rank finds so is the memory candidate, loaded tensor by
tensor from those snapshots. Per-rank state (RNG, PerRank) comes from the rank's own old
snapshot when the world size is the same, else starts fresh, as from storage under another
world size. So a shrink loses what a restart in place loses, not the steps since the last
persist.

A memory snapshot is identified by (step, generation): the ranks of one generation write the
snapshots of a step together, so a slot left over from another timeline (a rank killed between
loading and invalidating its newer slots) can never be mixed with its peers' slots of that step.

Nothing is unpickled before the checkpoint key vouches for it (auth.py): a memory snapshot or a
storage checkpoint whose manifest or pickles do not verify (altered, planted by another user, or
written under another key) is skipped like a corrupt one, with the reason as a warning.

Every candidate is checked before it is used, newest first, tier by tier: this rank's memory
snapshots (a sampled digest of the data file against its manifest, sample_digest.py), the
host's snapshots of other ranks and layouts and the peer copy's replicas (the same check on each
file used), then storage commits newest first (sizes and full checksums). A candidate that fails
its check on any rank, or whose load fails, is skipped by every rank with a warning, and the next
is tried; the reasons go to the agent with the restore (runtime.checkpoint_restored), and the
controller journals them. When the controller rejected a restore (the job failed the same way
right after restoring step N, twice: `restore_rejected`, docs/policy.md), it launches the next
generation with FTRUN_RESTORE_BEFORE=N (config.restore_before): no candidate of step N or later
is used.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ftrun import envcontract
from ftrun.checkpoint import auth, dcp_layout, restore_check, slots, storage
from ftrun.checkpoint.comm import Comm
from ftrun.checkpoint.config import CheckpointConfig
from ftrun.checkpoint.errors import CheckpointError, StateError
from ftrun.checkpoint.state import Flat, TensorLeaf, storage_key

MEMORY, STORAGE, NONE = "memory", "storage", "none"


@dataclass(frozen=True)
class Restored:
    """What restore() found: the step (0 when nothing), the tier, and where."""

    step: int
    tier: str
    path: str | None = None
    skipped: tuple[str, ...] = ()


def warn(message: str) -> None:
    print(f"ftrun-checkpoint: warning: {message}", file=sys.stderr, flush=True)


def restore(
    flat: Flat, *, comm: Comm, tier: slots.MemoryTier, config: CheckpointConfig
) -> tuple[Restored, dict[str, Any], int | None]:
    """Returns (what was restored, the loaded objects, the memory slot used or None)."""
    keyed = [(storage_key(leaf, comm.rank), leaf) for leaf in flat.tensors]
    entries, _ = slots.layout([(key, leaf.tensor) for key, leaf in keyed])
    sig = slots.signature(entries, comm.world)
    mac_key = config.hmac_key
    before = config.restore_before
    held: dict[tuple[int, int], int] = {}  # (step, generation) -> slot index
    found, rejected = tier.scan(sig) if tier.persistent else ([], [])
    for message in rejected:
        warn(f"rank {comm.rank}: {message}")
    for i in found:
        state = tier.states[i]
        if state.step is not None:  # scan() sets the step of every slot it returns
            held[(state.step, state.generation)] = i
    every = [{(step, gen) for step, gen in keys} for keys in comm.all_gather(sorted(held))]
    common = set.intersection(*every)
    skipped: list[str] = []
    refused = sorted((k for k in common if not allowed(k[0], before)), reverse=True)
    skipped += [_refused(f"the memory snapshot of step {step}", before) for step, _ in refused]
    # The newest step first, then the newest generation: each one tried in turn.
    memory = sorted((k for k in common if allowed(k[0], before)), reverse=True)

    listing: tuple[list[tuple[int, str, dict[str, Any]]], list[str]] | None = None
    if comm.rank == 0:
        good, bad = storage.list_candidates(config.directory, key=mac_key)
        listing = (
            [(c.step, str(c.path), c.manifest) for c in good],
            [f"{path} is not a valid checkpoint ({why}): skipped" for path, why in bad],
        )
    received = comm.broadcast(listing)
    assert received is not None  # rank 0 sent it
    listed, invalid = received
    skipped += invalid
    skipped += [_refused(path, before) for step, path, _ in listed if not allowed(step, before)]
    candidates = [c for c in listed if allowed(c[0], before)]  # newest first
    corrupt = bool(invalid)  # storage only: a memory tier that fails leaves no error, as before

    resharded: list[tuple[int, list[slots.HostSnapshot]]] | None = None  # once memory is spent
    while True:
        if not memory and resharded is None:
            resharded = []
            if tier.persistent and tier.directory is not None:
                resharded = _resharded_candidates(keyed, tier, comm, mac_key, before)
        other = resharded[0][0] if resharded else None
        newest = candidates[0][0] if candidates else None
        if memory and (newest is None or memory[0][0] >= newest):
            key = memory.pop(0)
            index = held[key]
            reason = _collective(
                comm, partial(restore_check.memory_slot, tier, index, key, mac_key)
            )
            if reason is None:
                try:
                    objects = _load_memory(flat, keyed, tier, index, comm, mac_key)
                except CheckpointError as exc:
                    reason = exc.message
                else:
                    path = str(tier.slot(index).manifest_path)
                    restored = Restored(key[0], MEMORY, path, tuple(skipped))
                    return _done(restored, comm), objects, index
            skipped.append(f"the memory snapshot of step {key[0]} is not used: {reason}")
        elif other is not None and (newest is None or other >= newest):
            assert resharded is not None
            step, snapshots = resharded.pop(0)
            reason = _collective(comm, partial(restore_check.host_snapshots, snapshots, mac_key))
            if reason is None:
                try:
                    objects = _load_resharded(flat, keyed, snapshots, comm, mac_key)
                except CheckpointError as exc:
                    reason = exc.message
                else:
                    path = str(snapshots[0].manifest_path)
                    restored = Restored(step, MEMORY, path, tuple(skipped))
                    return _done(restored, comm), objects, None
            skipped.append(f"the host's snapshot of step {step} is not used: {reason}")
        elif candidates:
            step, path, manifest = candidates.pop(0)
            mine = sorted(manifest["files"])[comm.rank :: comm.world]
            reason = _collective(
                comm,
                partial(
                    storage.verify_files,
                    Path(path),
                    manifest,
                    mine,
                    full=config.verify == "full",
                    key=mac_key,
                ),
            )
            if reason is None:
                objects = _load_storage(flat, keyed, Path(path), manifest, comm, mac_key)
                return _done(Restored(step, STORAGE, path, tuple(skipped)), comm), objects, None
            skipped.append(f"{path} is corrupt ({reason}): skipped")
            corrupt = True
        else:
            break

    if corrupt:
        raise CheckpointError(
            f"no valid checkpoint in {config.directory}: {len(skipped)} found, none loads",
            hint="see the warnings above; move the broken step-* directories away to start "
            "fresh. Checkpoints of another job verify only under its key: run with "
            f"{envcontract.CHECKPOINT_KEY} set to the content of its <job dir>/{auth.KEY_FILE}",
            data={"skipped": skipped},
        )
    return _done(Restored(0, NONE, None, tuple(skipped)), comm), {}, None


def allowed(step: int, before: int | None) -> bool:
    """Whether a checkpoint of `step` may be restored under the controller's rejection."""
    return before is None or step < before


def _refused(what: str, before: int | None) -> str:
    return (
        f"{what} is not used: the job failed the same way twice right after restoring step "
        f"{before} (restore_rejected), so this generation restores an older one"
    )


def _collective(comm: Comm, check: Callable[[], str | None]) -> str | None:
    """Run this rank's `check`; the first rank's reason (with its rank) if any rank failed."""
    try:
        mine = check()
    except Exception as exc:  # noqa: BLE001 - every rank must learn that one failed
        mine = f"{type(exc).__name__}: {exc}"
    reasons = comm.all_gather(f"rank {comm.rank}: {mine}" if mine else None)
    return next((r for r in reasons if r), None)


def _load_memory(
    flat: Flat,
    keyed: list[tuple[str, TensorLeaf]],
    tier: slots.MemoryTier,
    index: int,
    comm: Comm,
    mac_key: bytes,
) -> dict[str, Any]:
    slot, state = tier.slot(index), tier.states[index]
    error = None
    try:
        by_key = {e.key: e for e in state.entries}
        slot.populate()  # one call instead of a page fault per 4 KiB
        for key, leaf in keyed:
            leaf.tensor.copy_(slot.view(by_key[key]))
        saved = auth.loads(mac_key, state.objects)  # scan() checked it; checked again: cheap
    except Exception as exc:  # noqa: BLE001 - every rank must learn that one failed
        error = f"rank {comm.rank}: {type(exc).__name__}: {exc}"
    errors = [e for e in comm.all_gather(error) if e]
    if errors:
        raise CheckpointError(
            f"loading the memory snapshot failed: {errors[0]}",
            hint=f"delete {tier.directory} to restore from storage instead",
        )
    return {**saved["global"], **saved["local"]}


def _resharded_candidates(
    keyed: list[tuple[str, TensorLeaf]],
    tier: slots.MemoryTier,
    comm: Comm,
    mac_key: bytes,
    before: int | None,
) -> list[tuple[int, list[slots.HostSnapshot]]]:
    """Collective: for each (step, generation) every rank can serve so, newest first, the
    snapshots of this host that hold each tensor this rank needs (per-rank ones aside: they
    start fresh); empty when there is no such step. Each snapshot is checked first (its
    sampled digest), so a damaged one is passed over for another rank's or a replica of the
    same step."""
    assert tier.directory is not None
    found, rejected = slots.scan_host(tier.directory.parent, key=mac_key)
    for message in rejected:
        warn(f"rank {comm.rank}: {message}")
    checked = []
    for snapshot in found:
        if why := restore_check.host_snapshots([snapshot], mac_key):
            warn(f"rank {comm.rank}: memory snapshot not used: {why}")
        else:
            checked.append(snapshot)
    found = checked
    by_step: dict[tuple[int, int], list[slots.HostSnapshot]] = {}
    for snapshot in sorted(found, key=lambda s: s.rank):  # each step's by old rank
        by_step.setdefault((snapshot.step, snapshot.generation), []).append(snapshot)
    needed = [(key, leaf.tensor) for key, leaf in keyed if not leaf.local]
    servable = {
        step: snapshots
        for step, snapshots in by_step.items()
        if needed
        and allowed(step[0], before)
        and all(_source(key, t, snapshots) is not None for key, t in needed)
    }
    every = [{(step, gen) for step, gen in keys} for keys in comm.all_gather(sorted(servable))]
    common = set.intersection(*every)
    return [(key[0], servable[key]) for key in sorted(common, reverse=True)]


def _source(
    key: str, tensor: torch.Tensor, snapshots: list[slots.HostSnapshot]
) -> tuple[slots.HostSnapshot, slots.TensorEntry] | None:
    """The first snapshot (they are in old rank order) with `key` of the tensor's dtype and
    shape, and its entry."""
    dtype, shape = str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape)
    for snapshot in snapshots:
        entry = snapshot.entries.get(key)
        if entry is not None and (entry.dtype, entry.shape) == (dtype, shape):
            return snapshot, entry
    return None


def _load_resharded(
    flat: Flat,
    keyed: list[tuple[str, TensorLeaf]],
    snapshots: list[slots.HostSnapshot],
    comm: Comm,
    mac_key: bytes,
) -> dict[str, Any]:
    """Load the tensors from this host's snapshots of another layout, and the shared objects
    (the lowest rank's first, as from storage). Per-rank state comes from this rank's own old
    snapshot when the world size is the same and it is here (a re-plan, a replaced host), else
    it starts fresh, as from storage under another world size."""
    error, fresh = None, False
    merged: dict[str, Any] = {}
    try:
        own = next(
            (s for s in snapshots if (s.rank, s.world_size) == (comm.rank, comm.world)), None
        )
        local_keys = [(key, leaf.tensor) for key, leaf in keyed if leaf.local]
        fresh = own is None or any(_source(k, t, [own]) is None for k, t in local_keys)
        with contextlib.ExitStack() as stack:
            views = {id(s): stack.enter_context(s.mapped()) for s in snapshots}
            for key, leaf in keyed:
                if leaf.local and fresh:
                    continue
                found = _source(key, leaf.tensor, [own] if leaf.local and own else snapshots)
                assert found is not None  # _resharded_candidate, or `fresh`, made sure
                snapshot, entry = found
                leaf.tensor.copy_(views[id(snapshot)](entry))
        if changed := [str(s.manifest_path) for s in snapshots if not s.unchanged()]:
            raise CheckpointError(f"{changed[0]} changed while it was read")
        for snapshot in snapshots:  # sorted by rank
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
            f"loading the memory snapshot of another layout failed: {errors[0]}",
            hint=f"delete {snapshots[0].manifest_path.parent.parent} to restore from storage",
        )
    started_fresh = [r for r, (_, f) in enumerate(reports) if f]
    if comm.rank == 0:
        note = (
            f"; per-rank state (RNG, PerRank entries) of rank(s) {_ranges(started_fresh)} "
            "starts fresh"
            if started_fresh
            else ""
        )
        warn(
            f"step {snapshots[0].step} is restored from host memory saved in another layout "
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


def _load_storage(
    flat: Flat,
    keyed: list[tuple[str, TensorLeaf]],
    path: Path,
    manifest: dict[str, Any],
    comm: Comm,
    mac_key: bytes,
) -> dict[str, Any]:
    same_world = manifest["world_size"] == comm.world
    tensors = {name: leaf.tensor for name, leaf in keyed if same_world or not leaf.local}
    dcp_layout.load_storage(path, tensors, comm=comm, key=mac_key)
    merged: dict[str, Any] = {}
    local: dict[str, Any] = {}
    for r in range(manifest["world_size"]):
        name = storage.objects_file_name(r)
        if name not in manifest["files"]:
            continue
        try:
            saved = auth.loads(mac_key, storage.read_regular(path / name))
        except (auth.NotAuthentic, storage.Invalid, OSError) as exc:
            # verified by its rank a moment ago: it changed since, under our feet
            raise CheckpointError(f"{path / name} cannot be loaded: {exc}") from None
        for key, value in saved["global"].items():
            merged.setdefault(key, value)
        if r == comm.rank and same_world:
            local = saved["local"]
    if not same_world and comm.rank == 0:
        warn(
            f"{path} was saved by {manifest['world_size']} ranks, now {comm.world}: per-rank "
            "state (RNG, PerRank entries) starts fresh"
        )
    missing = [leaf.key for leaf in flat.objects if not leaf.local and leaf.key not in merged]
    if missing:
        raise StateError(
            f"{path} lacks {len(missing)} value(s) the state has, e.g. {missing[0]!r}",
            hint="the state passed to restore() must match the one saved",
        )
    return {**merged, **local}


def _done(restored: Restored, comm: Comm) -> Restored:
    if comm.rank == 0:
        for message in restored.skipped:
            warn(message)
    if restored.tier == NONE:
        print("ftrun-checkpoint: no checkpoint found, starting from step 0", flush=True)
    else:
        print(f"ftrun-checkpoint: restored step {restored.step} from {restored.tier}", flush=True)
    return restored
