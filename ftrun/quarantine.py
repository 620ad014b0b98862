"""The user's quarantine store: hosts that failed a job repeatedly, kept beyond that job.

A host that fails `failures` times within `window_s` is quarantined for `expiry_s`
(controller/host_health.py): no generation is placed on it. That used to last as long as the job;
a bad node then came back in the next job, and failed it again. The store keeps each quarantine,
with its reason and expiry, for every later `ftrun launch` (it leaves the host out and says why),
`ftrun sbatch` (`--exclude` for Slurm nodes) and `ftrun hosts add` (refused, with the way out:
`ftrun hosts --quarantined --clear HOST`).

One JSON file per user, `$XDG_STATE_HOME/ftrun/quarantine.json` (`~/.local/state/...`;
`FTRUN_QUARANTINE_FILE` names another): state, not config. Jobs of the same user write it at once,
so every change is a read-modify-write under an exclusive `flock` of a lock file beside it, and
written whole (temp + rename): a reader never sees half a file. It is the user's alone (0600 in a
0700 directory, refused otherwise: private.py). A store that cannot be read is never a reason for
a job not to start: `load` says why and the job goes on as if nothing were quarantined.

Hosts are keyed as the job named them (`node2`, `ada@node2:2222`); expired entries are dropped
on every write.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ftrun import private
from ftrun.envcontract import QUARANTINE_FILE
from ftrun.errors import UsageError

STORE_ENV = QUARANTINE_FILE
MAX_BYTES = 1 << 20  # thousands of hosts; a bigger file is not ours
HINT = "`ftrun hosts --quarantined --clear all` starts the store afresh"


@dataclass(frozen=True, kw_only=True)
class Entry:
    host: str
    until_t: float  # wall clock: when it may be used again
    reason: str  # the fault that put it there, as the journal says it
    failures: int
    job: str  # the job it failed
    transport: str  # "slurm": a node name `sbatch --exclude` may name
    since_t: float


def store_path(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get(STORE_ENV):
        return Path(env[STORE_ENV])
    state = env.get("XDG_STATE_HOME") or str(Path("~/.local/state").expanduser())
    return Path(state) / "ftrun" / "quarantine.json"


class StoreError(UsageError):
    pass


class QuarantineStore:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or store_path()

    # ---- reading ----------------------------------------------------------------------------

    def active(self, now_t: float | None = None) -> list[Entry]:
        """The entries not yet expired, soonest first. StoreError when the file is unsafe or
        unreadable (the caller decides whether that stops it)."""
        now_t = time.time() if now_t is None else now_t
        entries = [e for e in self._read().values() if e.until_t > now_t]
        return sorted(entries, key=lambda e: (e.until_t, e.host))

    def load(self, now_t: float | None = None) -> tuple[dict[str, Entry], str | None]:
        """{host: entry} of the active ones, and why the store was not read (None: it was).
        For a launch: a broken store must not stop a job."""
        try:
            return {e.host: e for e in self.active(now_t)}, None
        except StoreError as e:
            return {}, f"{e.message}; nothing taken as quarantined ({HINT})"

    def _read(self) -> dict[str, Entry]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise StoreError(f"cannot read the quarantine store {self.path}: {e.strerror}",
                             hint=HINT) from None  # fmt: skip
        try:
            st = os.fstat(fd)
            private.refuse_unless_ours(self.path, st, directory=False,
                                       forbid=private.GROUP_OTHER_WRITE,
                                       what="the quarantine store", hint=HINT,
                                       error=StoreError)  # fmt: skip
            if st.st_size > MAX_BYTES:
                raise StoreError(f"the quarantine store {self.path} is over 1 MiB", hint=HINT)
            data = os.read(fd, MAX_BYTES + 1)
        finally:
            os.close(fd)
        try:
            doc = json.loads(data)
            return {h: Entry(host=h, **fields) for h, fields in doc["hosts"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise StoreError(
                f"the quarantine store {self.path} is not one ftrun wrote ({type(e).__name__})",
                hint=HINT,
            ) from None

    # ---- writing ----------------------------------------------------------------------------

    def add(self, entry: Entry) -> None:
        """Keep `entry` (replacing the host's, unless that one lasts longer)."""
        with self._locked() as entries:
            old = entries.get(entry.host)
            if old is None or old.until_t < entry.until_t:
                entries[entry.host] = entry

    def clear(self, hosts: list[str]) -> list[str]:
        """Remove `hosts` (["all"]: every one); those that were there."""
        with self._locked(tolerate_broken="all" in hosts) as entries:
            gone = list(entries) if "all" in hosts else [h for h in hosts if h in entries]
            for host in gone:
                del entries[host]
            return gone

    @contextmanager
    def _locked(self, *, tolerate_broken: bool = False) -> Iterator[dict[str, Entry]]:
        directory = self.path.parent
        private.ensure_dir(directory, forbid=private.GROUP_OTHER_WRITE,
                           what="the quarantine store's directory", hint=HINT,
                           error=StoreError)  # fmt: skip
        lock = os.open(directory / f".{self.path.name}.lock",
                       os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)  # fmt: skip
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                entries = self._read()
            except StoreError:
                if not tolerate_broken:
                    raise
                entries = {}
            yield entries
            now_t = time.time()
            self._write({h: e for h, e in entries.items() if e.until_t > now_t})
        finally:
            os.close(lock)

    def _write(self, entries: dict[str, Entry]) -> None:
        doc: dict[str, Any] = {"version": 1, "hosts": {}}
        for host, entry in sorted(entries.items()):
            fields = asdict(entry)
            del fields["host"]
            doc["hosts"][host] = fields
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)  # fmt: skip
        try:
            try:
                os.write(fd, json.dumps(doc, indent=1).encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise StoreError(f"cannot write the quarantine store {self.path}: {e.strerror}",
                             hint=HINT) from None  # fmt: skip
