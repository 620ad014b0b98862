"""A fixed CPU capacity per testbed host, as a real machine has: one cgroup (v1 `cpu`) per host.

The testbed's hosts (tests/testbed.py) are network namespaces that share this machine's cores, so
a rank's share of a core falls as ranks are added: 4 ranks on 2 cores get half a core each, 3 get
two thirds. A cost model calibrated on 4 ranks then mispredicts 3 by the ratio of the shares, an
artefact no cluster has. Here each host's processes run in a cgroup of their own with a CFS quota
of `cpu_per_host` cores (the same for every host, their sum below the machine's cores) and high
`cpu.shares`, so that each host gets its quota whatever else the machine runs: a host is then a
device of a fixed speed, slower than a core, and a rank's speed no longer depends on how many
ranks there are.

Every process a host runs is started by its sshd and inherits its cgroup, so it is enough to move
the host's processes (its sshd and whatever is already under it) in after `up` and again after a
power-on (`Testbed.start` starts a fresh sshd); `confine` moves every live process of the host's
namespace, so one that slipped in between the power-on and the move is caught by the next call.
The period is short (10 ms by default) so a step of a few hundred ms spans many of them: with the
default 100 ms a rank runs 40 ms and then stalls 60 ms, and pipeline neighbours wait on the stall.

With `device_only`, the quota holds the host's ranks alone, not the whole host: each host's
cgroup has no quota (high shares still) and a child cgroup `device` has the quota, and `confine`
moves every rank (a process titled `ftrun rank …`, ftrun/agent/proctitle.py) and its children
there. The agent, sshd and torchrun then run beside the device, as on a host whose CPU is not its
accelerator (measured with the whole host held, the agent took 0.07-0.14 of a host's 0.4 core).
A rank runs in the host's cgroup until the next `confine` (the bench calls it once a second).

`close` (always, from `with`) moves what is left back to the root cgroup and removes the cgroups.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
SHARES = 65536  # of 262144 at most; the root cgroup's tasks weigh 1024 each


@dataclass
class HostCgroup:
    host: str
    path: Path
    moved: int = 0  # processes moved in, all calls together
    device: Path | None = None  # with device_only: the ranks' cgroup, inside `path`


def unavailable_reason() -> str | None:
    if not (CPU_ROOT / "cpu.cfs_quota_us").exists():
        return f"no cgroup v1 cpu controller at {CPU_ROOT}"
    if not os.access(CPU_ROOT, os.W_OK):
        return f"{CPU_ROOT} is not writable (needs root)"
    return None


class HostCpu:
    """A cgroup of `cpu_per_host` cores for each of `bed`'s hosts, for as long as `with` lasts."""

    def __init__(
        self,
        bed: Any,
        *,
        cpu_per_host: float,
        period_us: int = 10_000,
        name: str = "",
        device_only: bool = False,
    ) -> None:
        cores = os.cpu_count() or 1
        if not 0 < cpu_per_host * len(bed.hosts) < cores:
            raise ValueError(
                f"{cpu_per_host} cores x {len(bed.hosts)} hosts must stay below {cores} cores"
            )
        self.bed = bed
        self.cpu_per_host = cpu_per_host
        self.period_us = period_us
        self.name = name or f"ftrun-bench-{os.getpid()}"
        self.device_only = device_only
        self.groups: dict[str, HostCgroup] = {}

    def __enter__(self) -> HostCpu:
        try:
            for host in self.bed.hosts:
                path = CPU_ROOT / f"{self.name}-{host.name}"
                path.mkdir()
                group = self.groups[host.name] = HostCgroup(host.name, path)
                if self.device_only:
                    (path / "cpu.shares").write_text(str(SHARES))
                    group.device = path / "device"
                    group.device.mkdir()
                    _set_quota(group.device, self.cpu_per_host, self.period_us)
                else:
                    _set_quota(path, self.cpu_per_host, self.period_us)
            self.confine_all()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def confine(self, host: Any) -> int:
        """Moves every live process of `host` into its cgroup; how many were outside it."""
        group = self.groups[self.bed.host(host).name]
        members = set(_pids(group.path))
        on_device = set(_pids(group.device)) if group.device else set()
        moved = 0
        for pid in self.bed.pids(host):
            if pid in members or pid in on_device:
                continue
            if _move(pid, group.path):
                moved += 1
        if group.device is not None:
            for pid in _ranks_and_children(_pids(group.path)):
                moved += _move(pid, group.device)
        group.moved += moved
        return moved

    def confine_all(self) -> int:
        return sum(self.confine(host) for host in self.bed.hosts)

    def stats(self) -> dict[str, dict[str, int]]:
        """Per host: CFS periods, how many were throttled, and the time throttled (ns)."""
        out = {}
        for name, group in self.groups.items():
            try:
                stat = (group.device or group.path) / "cpu.stat"
                fields = dict(line.split() for line in stat.read_text().splitlines())
            except OSError:
                continue
            out[name] = {k: int(v) for k, v in fields.items()} | {"moved": group.moved}
        return out

    def close(self) -> None:
        """Idempotent: what is still in a cgroup goes back to the root cgroup, then it goes."""
        for group in list(self.groups.values()):
            for path in [group.device, group.path] if group.device else [group.path]:
                for _ in range(3):  # a process may fork while we move
                    _empty(path)
                    try:
                        path.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        continue
                if path.exists():
                    print(f"hostcpu: could not remove {path}", file=sys.stderr)
            self.groups.pop(group.host, None)


@contextlib.contextmanager
def held(name: str, *, cpu: float, period_us: int = 10_000) -> Iterator[Callable[[], None]]:
    """A cgroup of `cpu` cores with high shares, for one process started in the `with`: yields
    a `preexec_fn` that moves the child in before it runs (its children follow). The profile
    runs in one, so that another session's load on this machine does not inflate some layers'
    timings and not others, which skews the split the planner chooses."""
    path = CPU_ROOT / name
    path.mkdir()
    try:
        _set_quota(path, cpu, period_us)
        procs = str(path / "cgroup.procs")

        def enter() -> None:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        yield enter
    finally:
        _empty(path)
        try:
            path.rmdir()
        except OSError as e:
            print(f"hostcpu: could not remove {path}: {e}", file=sys.stderr)


def _set_quota(path: Path, cpu: float, period_us: int) -> None:
    """`cpu` cores every `period_us`, with high shares so that the quota is had under load."""
    (path / "cpu.cfs_period_us").write_text(str(period_us))
    (path / "cpu.cfs_quota_us").write_text(str(int(cpu * period_us)))
    (path / "cpu.shares").write_text(str(SHARES))


def _empty(path: Path) -> None:
    """Every process of the cgroup at `path` back into the root cgroup (one gone meanwhile, or
    a zombie, is skipped)."""
    for pid in _pids(path):
        try:
            (CPU_ROOT / "cgroup.procs").write_text(str(pid))
        except OSError:
            continue


def _move(pid: int, path: Path) -> bool:
    try:
        (path / "cgroup.procs").write_text(str(pid))
        return True
    except (ProcessLookupError, OSError):
        return False  # gone meanwhile (or a zombie)


def _ranks_and_children(pids: list[int]) -> list[int]:
    """Of `pids`, the ranks (titled `ftrun rank …`) and every process below one of them."""
    parent: dict[int, int] = {}
    ranks: set[int] = set()
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            parent[pid] = int(stat.rsplit(")", 1)[1].split()[1])
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ftrun rank "):
                ranks.add(pid)
        except (OSError, ValueError, IndexError):
            continue
    out = []
    for pid in parent:
        p, seen = pid, 0
        while p in parent and p not in ranks and seen < 64:
            p, seen = parent[p], seen + 1
        if p in ranks:
            out.append(pid)
    return out


def _pids(path: Path) -> list[int]:
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except OSError:
        return []
