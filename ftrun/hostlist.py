"""Host lists as users write them: `--hosts a,b,user@c:2222` and DeepSpeed/MPI-style hostfiles.

    # hostfile: one host per line, `#` starts a comment
    worker-1 slots=8
    alice@worker-2:2222 slots=8

A host is kept as the target the user wrote (`user@host:port`, minus `slots=`): that is what ssh
connects to, what logs and `ftrun status` show, and what `ftrun hosts JOB remove` names. Pure:
parsing only, every problem reported at once as a UsageError.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ftrun.errors import UsageError

LOCALHOST = "localhost"
_TARGET = re.compile(
    r"(?:(?P<user>[^@\s:]+)@)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)"
    r"(?::(?P<port>\d+))?"
)


@dataclass(frozen=True)
class HostEntry:
    target: str  # "worker-2", "alice@worker-2:2222"
    slots: int | None = None


@dataclass(frozen=True)
class SshTarget:
    host: str
    user: str | None = None
    port: int | None = None


def split_target(target: str) -> SshTarget:
    """`user@host:port` → its parts (IPv6 literals in brackets: `[fe80::1]:22`)."""
    match = _TARGET.fullmatch(target)
    if match is None:
        raise UsageError(
            f"{target!r} is not a host (expected host, user@host or user@host:port)",
            hint="see `ftrun launch --help` for --hosts and --hostfile",
        )
    port = match["port"]
    return SshTarget(match["host"].strip("[]"), match["user"], int(port) if port else None)


def parse_host_list(text: str, *, what: str = "--hosts") -> list[HostEntry]:
    """A comma-separated list, as in `--hosts a,b,c` (empty items are ignored)."""
    entries: list[HostEntry] = []
    problems: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if item:
            _add(entries, problems, item, None, what)
    _raise(problems)
    return entries


def read_hostfile(path: Path) -> list[HostEntry]:
    """`host [slots=N]` per line, `#` comments, blank lines ignored."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise UsageError(
            f"cannot read the hostfile {str(path)!r}: {e.strerror or e}",
            hint="pass an existing file to --hostfile",
        ) from None
    except UnicodeDecodeError as e:
        raise UsageError(
            f"the hostfile {str(path)!r} is not UTF-8 text (byte {e.start})",
            hint="a hostfile has one `host [slots=N]` per line",
        ) from None
    entries: list[HostEntry] = []
    problems: list[str] = []
    for number, line in enumerate(lines, start=1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        where = f"{path}:{number}"
        slots: int | None = None
        for extra in fields[1:]:
            key, _, value = extra.partition("=")
            if key != "slots":
                problems.append(f"{where}: unknown field {extra!r} (only slots=N)")
            elif not (value.isascii() and value.isdigit()) or int(value) < 1:
                problems.append(f"{where}: slots must be a whole number ≥ 1 (got {value!r})")
            else:
                slots = int(value)
        _add(entries, problems, fields[0], slots, where)
    if not entries and not problems:
        problems.append(f"the hostfile {path} names no host")
    _raise(problems)
    return entries


def check_roles(hosts: list[HostEntry], spares: list[HostEntry], min_nodes: int | None) -> None:
    """Hosts and spares are distinct, and min-nodes is reachable."""
    problems = []
    seen: set[str] = set()
    for entry in [*hosts, *spares]:
        if entry.target in seen:
            problems.append(f"host {entry.target!r} is named twice")
        seen.add(entry.target)
    if min_nodes is not None and not 1 <= min_nodes <= len(hosts):
        problems.append(
            f"--min-nodes must be in 1..{len(hosts)} (the number of hosts); got {min_nodes}"
        )
    _raise(problems)


def uniform_slots(entries: list[HostEntry]) -> int | None:
    """The one slot count every host declares, None when none declares one."""
    counts = {e.slots for e in entries if e.slots is not None}
    if not counts:
        return None
    if len(counts) > 1 or any(e.slots is None for e in entries):
        raise UsageError(
            "hosts with different slots= are not supported: every host runs "
            f"--nproc-per-node ranks (got {sorted(counts)})",
            hint="give every host the same slots=, or drop slots= and pass --nproc-per-node",
        )
    return counts.pop()


def _add(
    entries: list[HostEntry], problems: list[str], target: str, slots: int | None, where: str
) -> None:
    match = _TARGET.fullmatch(target)
    if match is None:
        problems.append(
            f"{where}: {target!r} is not a host (expected host, user@host or user@host:port)"
        )
    elif match["port"] and not 0 < int(match["port"]) < 65536:
        problems.append(f"{where}: port {match['port']} of {target!r} is not in 1..65535")
    else:
        entries.append(HostEntry(target, slots))


def _raise(problems: list[str]) -> None:
    if problems:
        raise UsageError(
            "; ".join(problems),
            hint="hosts are `host`, `user@host` or `user@host:port`; a hostfile "
            "has one per line, optionally with slots=N",
        )
