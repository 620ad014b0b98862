"""Which hosts `ftrun launch` runs on, from its flags: --hosts, --hostfile and --spares over ssh,
the nodes of a Slurm allocation under --slurm, or this machine.

Like every launch check (launch_inputs.py), these collect their problems into the caller's list
instead of raising, so that all that is wrong with a command line is said in one message.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ftrun.errors import FtrunError, UsageError
from ftrun.hostlist import LOCALHOST, check_roles, parse_host_list, read_hostfile, uniform_slots
from ftrun.transport.slurm_allocation import Allocation, read_allocation


@dataclasses.dataclass(frozen=True)
class HostOptions:
    """Where the job runs: its hosts and spares, the transport that reaches them, the ranks per
    host a hostfile's slots give, and the allocation under --slurm."""

    hosts: tuple[str, ...] = (LOCALHOST,)
    spares: tuple[str, ...] = ()
    transport: str = "local"
    slots: int | None = None
    allocation: Allocation | None = None  # under Slurm


def host_options(
    hosts: str | None,
    hostfile: Path | None,
    spares: str | None,
    ssh_config: Path | None,
    problems: list[str],
) -> HostOptions:
    """--hosts / --hostfile / --spares → host targets; problems are collected, not raised."""
    if hosts is not None and hostfile is not None:
        problems.append("--hosts and --hostfile cannot be used together")
        return HostOptions()
    if ssh_config is not None:
        problems.extend(ssh_config_problems(ssh_config))
    try:
        entries = (
            read_hostfile(hostfile)
            if hostfile is not None
            else parse_host_list(hosts)
            if hosts is not None
            else []
        )
        spare_entries = parse_host_list(spares, what="--spares") if spares else []
        if hosts is not None and not entries:
            problems.append("--hosts names no host")
        if not entries:
            return HostOptions(spares=tuple(e.target for e in spare_entries))
        check_roles(entries, spare_entries, None)
        return HostOptions(
            tuple(e.target for e in entries),
            tuple(e.target for e in spare_entries),
            transport="ssh",
            slots=uniform_slots(entries),
        )  # spares run as many
    except UsageError as e:
        problems.append(e.message)
        return HostOptions()


def slurm_hosts(
    hosts: str | None,
    hostfile: Path | None,
    spares: str | None,
    slurm_spares: int,
    problems: list[str],
) -> HostOptions:
    """--slurm: the nodes of this job's allocation, the last `slurm_spares` of them as spares."""
    for flag, value in (("--hosts", hosts), ("--hostfile", hostfile), ("--spares", spares)):
        if value is not None:
            problems.append(
                f"{flag} cannot be used with --slurm: the nodes come from the allocation "
                "(spares: --slurm-spares K)"
            )
    try:
        allocation = read_allocation()
        nodes, spare_nodes = allocation.split(slurm_spares)
    except FtrunError as e:
        problems.append(e.message)
        return HostOptions()
    return HostOptions(nodes, spare_nodes, transport="slurm", allocation=allocation)


def ssh_config_problems(path: Path) -> list[str]:
    if not path.is_file():
        return [f"--ssh-config {str(path)!r} is not a file"]
    import paramiko  # what Fabric parses it with

    try:
        paramiko.SSHConfig.from_path(str(path))
    except Exception as e:  # noqa: BLE001 - ConfigParseError, or an unreadable file
        return [f"--ssh-config {str(path)!r} cannot be parsed: {e}"]
    return []


def default_standby(
    host_list: HostOptions, standby: str | None, off: bool, problems: list[str]
) -> str | None:
    """The host that keeps a standby controller (docs/standby.md): the one named, else over ssh
    the first spare (it runs no ranks), else the second host; none with --no-standby, under
    Slurm (the agents requeue the job there), or with one host and no spare."""
    if off:
        if standby is not None:
            problems.append("--standby and --no-standby cannot be used together")
        return None
    if standby is not None or host_list.transport != "ssh":
        return standby
    if host_list.spares:
        return host_list.spares[0]
    return host_list.hosts[1] if len(host_list.hosts) > 1 else None
