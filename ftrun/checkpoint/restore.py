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

When no step is in every rank's own tier (the layout changed: a shrink, a grow, another DP x PP
plan; or a restart in place whose ranks' slots turned apart), each rank looks at every snapshot
its host's memory holds, of any rank and layout (reshard.py), for one step that has every tensor
it needs, by name, dtype and shape. In the same layout that step is used only if every rank
also has its own snapshot of it, since a rank's per-rank state (RNG, PerRank) is in that one
alone; in another layout per-rank state comes from the rank's own old snapshot where it fits,
else starts fresh, and rank 0 names the ranks whose per-rank state is not restored. So a shrink
loses what a restart in place loses, not the steps since the last persist.

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

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from ftrun import envcontract
from ftrun.checkpoint import auth, dcp_layout, reshard, restore_check, slots, storage
from ftrun.checkpoint.comm import Comm
from ftrun.checkpoint.config import CheckpointConfig
from ftrun.checkpoint.errors import CheckpointError, StateError
from ftrun.checkpoint.errors import warn as warn  # what the other modules import from here
from ftrun.checkpoint.slot_layout import layout, signature
from ftrun.checkpoint.state import Flat, TensorLeaf, storage_key

MEMORY, STORAGE, NONE = "memory", "storage", "none"


@dataclass(frozen=True)
class Restored:
    """What restore() found: the step (0 when nothing), the tier, and where."""

    step: int
    tier: str
    path: str | None = None
    skipped: tuple[str, ...] = ()


def restore(
    flat: Flat, *, comm: Comm, tier: slots.MemoryTier, config: CheckpointConfig
) -> tuple[Restored, dict[str, Any], int | None]:
    """Returns (what was restored, the loaded objects, the memory slot used or None)."""
    keyed = [(storage_key(leaf, comm.rank), leaf) for leaf in flat.tensors]
    entries, _ = layout([(key, leaf.tensor) for key, leaf in keyed])
    sig = signature(entries, comm.world)
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

    resharded: list[reshard.Candidate] | None = None  # once memory is spent
    while True:
        if not memory and resharded is None:
            resharded = []
            if tier.persistent and tier.directory is not None:
                resharded, refused_here = reshard.candidates(
                    keyed, sig, tier, comm, mac_key, partial(allowed, before=before)
                )
                skipped += refused_here
        other = resharded[0].step if resharded else None
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
            candidate = resharded.pop(0)
            step, snapshots = candidate.step, candidate.snapshots
            reason = _collective(comm, partial(restore_check.host_snapshots, snapshots, mac_key))
            if reason is None:
                try:
                    objects = reshard.load(flat, keyed, candidate, comm, mac_key)
                except CheckpointError as exc:
                    reason = exc.message
                else:
                    path = str((candidate.own or snapshots[0]).manifest_path)
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
