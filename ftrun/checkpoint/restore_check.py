"""The check a memory snapshot passes before restore uses it: its data against the sampled
digest its manifest recorded at the commit (sample_digest.py).

scan() (slots.py) has already authenticated the manifest and the sealed objects; what is left
is the data file, which has no seal: a snapshot changed after its commit (the live file updated
in place outside the fenced optimizer step, an optimizer step cut short by a SIGKILL), or torn
(a copy or a replica cut short under a manifest), holds another state than the step it names.
The manifest is read again here, by the same rules, for the digest; it must be the one scanned
(the same step and generation, the same file). Each function returns why the snapshot is not to
be used, or None.
"""

from __future__ import annotations

import os

from ftrun.checkpoint import auth, sample_digest, slots, storage
from ftrun.checkpoint.host_snapshots import HostSnapshot
from ftrun.checkpoint.memory_manifest import manifest_entries


def memory_slot(
    tier: slots.MemoryTier, index: int, held: tuple[int, int], key: bytes
) -> str | None:
    """This rank's slot `index`, scanned as holding (step, generation) `held`."""
    slot, state = tier.slot(index), tier.states[index]
    if slot.manifest_path is None:
        return "the slot has no manifest"
    try:
        body = storage.read_json_checked(slot.manifest_path, key=key)
    except (storage.Invalid, auth.NotAuthentic, OSError) as exc:
        return f"its manifest changed since the scan ({exc})"
    if (body.get("step"), body.get("generation")) != held:
        return "its manifest changed since the scan"
    spans = sample_digest.spans_of(state.entries)
    why = sample_digest.mismatch(slot.base, spans, body.get("digest"))
    return f"{slot.data_path} {why}" if why else None


def host_snapshots(snapshots: list[HostSnapshot], key: bytes) -> str | None:
    """Each snapshot of another rank or layout, or replica, that a resharded load reads."""
    for snapshot in snapshots:
        try:
            inode = os.lstat(snapshot.manifest_path).st_ino
            body = storage.read_json_checked(snapshot.manifest_path, key=key)
        except (storage.Invalid, auth.NotAuthentic, OSError) as exc:
            return f"{snapshot.manifest_path} changed since the scan ({exc})"
        if inode != snapshot.manifest_inode:
            return f"{snapshot.manifest_path} changed since the scan"
        spans = sample_digest.spans_of(manifest_entries(body))
        try:
            why = sample_digest.file_mismatch(snapshot.data_path, spans, body.get("digest"))
        except OSError as exc:
            return f"{snapshot.data_path} cannot be read: {exc}"
        if why:
            return f"{snapshot.data_path} {why}"
    return None
