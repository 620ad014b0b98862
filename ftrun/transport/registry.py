"""The transports by name: how each is made from a LaunchConfig, and what it can do.

Code outside ftrun/transport/ asks a transport's capabilities here instead of comparing its name:
whether its agents run on other machines (TLS on the control plane, the controller's address
for them to dial), whether it checks ssh host keys, whether its agents outlive a lost
controller for --controller-grace (so a resumed controller can adopt their ranks: not under
srun, whose steps end with the batch step), and what must hold to resume one of its jobs.
Each backend names the options dataclass it takes (options.py; nested in the LaunchConfig as
`transport_options`). Adding a transport is one `Backend` here, its module, and the transport contract test
(tests/integration/test_transport_contract.py) run against it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ftrun.config import LaunchConfig
from ftrun.errors import UsageError
from ftrun.transport.base import Transport
from ftrun.transport.options import LocalOptions, Options, SlurmOptions, SshOptions, T, pick


@dataclass(frozen=True, kw_only=True)
class Backend:
    name: str
    options: type[Options]  # its own options (options.py), LaunchConfig.transport_options
    make: Callable[[LaunchConfig], Transport]
    remote: bool  # agents on other machines: an encrypted control plane, an address to dial
    checks_host_keys: bool  # ssh host keys against known_hosts (transport/hostkeys.py)
    agents_wait_for_controller: bool  # a lost controller's agents keep their ranks for a while
    # Why a job of this transport cannot be resumed from here (None: it can).
    resume_problem: Callable[[str], str | None] = lambda job: None
    hosts_given_by: str = "--hosts names"  # how the user gave the hosts, for messages


def _local(config: LaunchConfig) -> Transport:
    from ftrun.transport.local import LocalTransport

    return LocalTransport(config.python)


def _ssh(config: LaunchConfig) -> Transport:
    from ftrun.transport.ssh import SshTransport  # fabric and paramiko only when needed

    ssh = options_of(config, SshOptions) or SshOptions()
    return SshTransport(
        python=config.agent_python,
        ssh_config=ssh.ssh_config,
        controller_addr=config.controller_addr,
        check_host_keys=ssh.check_host_keys,
    )


def _slurm(config: LaunchConfig) -> Transport:
    from ftrun.transport.slurm import SrunTransport

    return SrunTransport(python=config.agent_python, controller_addr=config.controller_addr)


def _outside_allocation(job: str) -> str | None:
    from ftrun.transport.slurm_allocation import in_allocation

    if in_allocation():
        return None
    return f"job {job} ran in a Slurm allocation, and this shell is not in one"


BACKENDS = {
    b.name: b
    for b in (
        Backend(
            name="local",
            options=LocalOptions,
            make=_local,
            remote=False,
            checks_host_keys=False,
            agents_wait_for_controller=True,
            hosts_given_by="this machine has",
        ),
        Backend(
            name="ssh",
            options=SshOptions,
            make=_ssh,
            remote=True,
            checks_host_keys=True,
            agents_wait_for_controller=True,
        ),
        Backend(
            name="slurm",
            options=SlurmOptions,
            make=_slurm,
            remote=True,
            checks_host_keys=False,
            agents_wait_for_controller=False,
            resume_problem=_outside_allocation,
            hosts_given_by="the Slurm allocation (less --slurm-spares) has",
        ),
    )
}


def backend(name: str) -> Backend:
    """The transport named `name` (a config.json may name one this ftrun does not have)."""
    found = BACKENDS.get(name)
    if found is None:
        raise UsageError(
            f"no transport {name!r} (one of {', '.join(BACKENDS)})",
            hint="the job was written by another version of ftrun",
        )
    return found


def make_transport(config: LaunchConfig) -> Transport:
    found = backend(config.transport)
    if not isinstance(config.transport_options, found.options | None):
        raise UsageError(
            f"the {found.name} transport takes {found.options.__name__}, "
            f"not {type(config.transport_options).__name__}",
            hint="the job's settings were written by another version of ftrun",
        )
    return found.make(config)


def options_from(name: str, values: Mapping[str, Any]) -> Options:
    """Transport `name`'s options, from whatever values are given (the CLI's flags, or a
    config.json: nested, or flat as an ftrun of before wrote it); the rest are ignored."""
    return pick(backend(name).options, values)


def options_of(config: LaunchConfig, kind: type[T]) -> T | None:
    """The job's transport options when they are `kind` (None: another transport's): what
    code outside ftrun/transport/ asks instead of comparing the transport's name."""
    if isinstance(config.transport_options, kind):
        return config.transport_options
    if config.transport_options is None and backend(config.transport).options is kind:
        return kind()
    return None
