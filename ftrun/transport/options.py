"""Each transport's own options: a small frozen dataclass per backend, nested in
LaunchConfig.transport_options (registry.py names which class a backend takes).

The field names are the flags' (and config.json's of before they were nested), and unique
across the backends: the CLI hands every value it has to `pick`, and each backend keeps what
is its own. So a job launched by an ftrun of before, whose config.json has them flat, resumes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar


@dataclass(frozen=True, kw_only=True)
class LocalOptions:
    """This machine: nothing to choose."""


@dataclass(frozen=True, kw_only=True)
class SshOptions:
    ssh_config: str | None = None  # an ssh_config file instead of ~/.ssh/config
    # Host keys checked against known_hosts (hostkeys.py); False only with
    # --insecure-skip-host-key-check.
    check_host_keys: bool = True


@dataclass(frozen=True, kw_only=True)
class SlurmOptions:
    """The allocation the job runs in (docs/slurm.md)."""

    slurm_job_id: str | None = None
    slurm_restart_count: int = 0  # SLURM_RESTART_COUNT: how many times Slurm requeued the job
    gpus_per_node: int | None = None


Options = LocalOptions | SshOptions | SlurmOptions
T = TypeVar("T", LocalOptions, SshOptions, SlurmOptions)


def pick(kind: type[Options], values: Mapping[str, Any]) -> Options:
    """`kind` made of those of `values` that are its fields (the rest are other backends')."""
    names = {f.name for f in dataclasses.fields(kind)}
    return kind(**{k: v for k, v in values.items() if k in names})
