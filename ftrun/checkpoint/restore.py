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

A memory snapshot is identified by (step, generation): the ranks of one generation write the
snapshots of a step together, so a slot left over from another timeline (a rank killed between
loading and invalidating its newer slots) can never be mixed with its peers' slots of that step.

Nothing is unpickled before the checkpoint key vouches for it (auth.py): a memory snapshot or a
storage checkpoint whose manifest or pickles do not verify (altered, planted by another user, or
written under another key) is skipped like a corrupt one, with the reason as a warning.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftrun import envcontract
from ftrun.checkpoint import auth, dcp_layout, slots, storage
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
    best_key = max(common) if common else None  # the newest step, then the newest generation
    best_mem = best_key[0] if best_key else None

    listing: tuple[list[tuple[int, str, dict[str, Any]]], list[str]] | None = None
    if comm.rank == 0:
        good, bad = storage.list_candidates(config.directory, key=mac_key)
        listing = (
            [(c.step, str(c.path), c.manifest) for c in good],
            [f"{path} is not a valid checkpoint ({why}): skipped" for path, why in bad],
        )
    received = comm.broadcast(listing)
    assert received is not None  # rank 0 sent it
    candidates, skipped = received
    skipped = list(skipped)

    for step, path, manifest in candidates:
        if best_mem is not None and step <= best_mem:
            break
        mine = sorted(manifest["files"])[comm.rank :: comm.world]
        reason = storage.verify_files(
            Path(path), manifest, mine, full=config.verify == "full", key=mac_key
        )
        reasons = [r for r in comm.all_gather(reason) if r]
        if not reasons:
            objects = _load_storage(flat, keyed, Path(path), manifest, comm, mac_key)
            return _done(Restored(step, STORAGE, path, tuple(skipped)), comm), objects, None
        skipped.append(f"{path} is corrupt ({reasons[0]}): skipped")

    if best_key is not None:
        index = held[best_key]
        objects = _load_memory(flat, keyed, tier, index, comm, mac_key)
        path = str(tier.slots[index].manifest_path)
        return _done(Restored(best_key[0], MEMORY, path, tuple(skipped)), comm), objects, index
    if candidates or skipped:
        raise CheckpointError(
            f"no valid checkpoint in {config.directory}: {len(skipped)} found, none loads",
            hint="see the warnings above; move the broken step-* directories away to start "
            "fresh. Checkpoints of another job verify only under its key: run with "
            f"{envcontract.CHECKPOINT_KEY} set to the content of its <job dir>/{auth.KEY_FILE}",
            data={"skipped": skipped},
        )
    return _done(Restored(0, NONE, None, tuple(skipped)), comm), {}, None


def _load_memory(
    flat: Flat,
    keyed: list[tuple[str, TensorLeaf]],
    tier: slots.MemoryTier,
    index: int,
    comm: Comm,
    mac_key: bytes,
) -> dict[str, Any]:
    slot, state = tier.slots[index], tier.states[index]
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
