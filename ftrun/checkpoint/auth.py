"""Checkpoint authentication: nothing ftrun.checkpoint reads back is unpickled unless this job's
key vouches for it.

A pickle runs code when it is loaded, and the checkpoint tiers live where another user may reach
them (/dev/shm, a shared storage directory). So every pickle ftrun.checkpoint writes (the
non-tensor objects of a save, in the memory tier and in storage; DCP's `.metadata`) is sealed:

    b"ftrun-sealed-pickle/1\\n" + HMAC-SHA256(key, that prefix + payload) + payload

and `loads()`, the only place that unpickles stored bytes, checks the tag in constant time
(`hmac.compare_digest`) before `pickle.loads` sees a byte. Every JSON manifest carries an `hmac`
beside its CRC32, over the same canonical form (another prefix, so a manifest's tag never passes
for a pickle's). What fails is corrupt: the memory slot or the storage checkpoint is skipped with
a warning and restore falls back to the next tier or an older checkpoint. Tensor bytes are not
sealed: they are raw numbers, never code, checked by size and XXH3 (digest.py) (and written into
directories of this user only). The persist worker's pipe (worker.py) carries pickles too, but
between a rank and its own child over a private pipe that no other user can open.

The key (32 random bytes, hex in text):
- `$FTRUN_CHECKPOINT_KEY` when set: `ftrun launch` sets it for every rank, from the job's
  `<job dir>/checkpoint.key` (made once per job, so a restarted controller or a requeued Slurm
  job verifies what it wrote before), or from the launcher's own FTRUN_CHECKPOINT_KEY when the
  user gives one (to share checkpoints between jobs);
- otherwise (plain torchrun or python) the user's key, `$XDG_CONFIG_HOME/ftrun/checkpoint.key`
  (`~/.config/ftrun/checkpoint.key`), made 0600 on first use. Config, not cache: a cache may be
  wiped to free a quota, and a lost key makes every checkpoint written under it unloadable.
Pure Python (no torch): the persist worker imports it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ftrun import envcontract, private
from ftrun.checkpoint.errors import CheckpointKeyError

PICKLE_MAGIC = b"ftrun-sealed-pickle/1\n"
_JSON_DOMAIN = b"ftrun-checkpoint-json/1\n"
TAG_BYTES = hashlib.sha256().digest_size
KEY_FILE = "checkpoint.key"
KEY_HINT = (
    f"set {envcontract.CHECKPOINT_KEY} to 64 hex digits (e.g. the job's <job dir>/{KEY_FILE}), "
    "or remove the key file to make a new one (checkpoints written under the old key will no "
    "longer load)"
)


class NotAuthentic(ValueError):
    """Bytes the checkpoint key does not vouch for: altered, planted, or written under another
    key. Treated like a corrupt checkpoint, never loaded."""


def seal(key: bytes, payload: bytes) -> bytes:
    return PICKLE_MAGIC + _tag(key, PICKLE_MAGIC, payload) + payload


def unseal(key: bytes, blob: bytes) -> memoryview:
    """The payload of a sealed blob; NotAuthentic unless the key's tag matches."""
    view = memoryview(blob)
    head = len(PICKLE_MAGIC)
    if bytes(view[:head]) != PICKLE_MAGIC or len(view) < head + TAG_BYTES:
        raise NotAuthentic("not sealed by ftrun.checkpoint")
    tag, payload = bytes(view[head : head + TAG_BYTES]), view[head + TAG_BYTES :]
    if not hmac.compare_digest(tag, _tag(key, PICKLE_MAGIC, payload)):
        raise NotAuthentic("its HMAC does not match this job's checkpoint key")
    return payload


def dumps(key: bytes, value: Any) -> bytes:
    return seal(key, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def loads(key: bytes, blob: bytes) -> Any:
    """Unpickle a sealed blob, after its tag is checked; NotAuthentic otherwise."""
    return pickle.loads(unseal(key, blob))


def canonical(body: Mapping[str, Any]) -> bytes:
    """A JSON body in canonical form (sorted keys, no spaces): what its CRC32 and HMAC cover."""
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def json_tag(key: bytes, body: Mapping[str, Any]) -> str:
    return canonical_tag(key, canonical(body))


def canonical_tag(key: bytes, canonical_body: bytes) -> str:
    """json_tag of a body already in canonical form."""
    return _tag(key, _JSON_DOMAIN, canonical_body).hex()


def json_authentic(key: bytes, body: Mapping[str, Any], tag: object) -> bool:
    return isinstance(tag, str) and hmac.compare_digest(tag, json_tag(key, body))


def _tag(key: bytes, domain: bytes, payload: bytes | memoryview) -> bytes:
    mac = hmac.new(key, domain, hashlib.sha256)
    mac.update(payload)
    return mac.digest()


def user_key_path(environ: Mapping[str, str]) -> Path:
    """`$XDG_CONFIG_HOME/ftrun/checkpoint.key`, else `~/.config/ftrun/checkpoint.key`."""
    base = environ.get("XDG_CONFIG_HOME", "")
    if not os.path.isabs(base):  # unset, or relative: the XDG spec says to ignore it
        home = environ.get("HOME") or os.path.expanduser("~")
        base = os.path.join(home, ".config")
    return Path(base) / "ftrun" / KEY_FILE


def load_key(environ: Mapping[str, str] | None = None) -> bytes:
    """The checkpoint key of this rank: $FTRUN_CHECKPOINT_KEY, else the user's key file."""
    env = os.environ if environ is None else environ
    text = env.get(envcontract.CHECKPOINT_KEY)
    if text:
        return private.parse_key(
            text, source=f"${envcontract.CHECKPOINT_KEY}", hint=KEY_HINT, error=CheckpointKeyError
        )
    return private.key_file(
        user_key_path(env),
        dir_forbid=private.GROUP_OTHER_WRITE,
        what="the checkpoint key",
        hint=KEY_HINT,
        error=CheckpointKeyError,
    )
