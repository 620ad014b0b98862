"""The Slurm allocation a job runs in, as Slurm's own commands describe it.

Everything ftrun needs to know about the allocation comes from the variables Slurm gives the
batch step (`SLURM_JOB_ID`, `SLURM_JOB_NODELIST`, `SLURM_GPUS_ON_NODE`, `SLURM_RESTART_COUNT`) and
from `scontrol`: the node list expanded (`scontrol show hostnames`, never a parser of our own for
`node[1-3,7]`), a node's address and state, and `scontrol requeue`, through the client in
ftrun/slurmctl.py.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from ftrun.errors import UsageError
from ftrun.slurmctl import node_fields, scontrol

# Node states (scontrol's State=, first word) in which a node cannot run an agent any more.
# A draining node still runs what it has (ours included): only these are refused.
DEAD_STATES = frozenset({"DOWN", "FAIL", "FUTURE"})


@dataclass(frozen=True)
class Allocation:
    """The allocation this process runs in: its job id, nodes (in Slurm's order) and per-node
    GPUs; `restart_count` is how many times Slurm requeued the job (0 the first time)."""

    job_id: str
    nodes: tuple[str, ...]
    gpus_per_node: int | None = None
    restart_count: int = 0
    array_job_id: str | None = None
    array_task_id: str | None = None

    def split(self, spares: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(training nodes, spares): the spares are the last `spares` nodes of the allocation."""
        if not 0 <= spares < len(self.nodes):
            raise UsageError(
                f"--slurm-spares {spares} leaves no node to train on: the allocation has "
                f"{len(self.nodes)} node(s) ({','.join(self.nodes)})",
                hint="ask sbatch for more nodes, or fewer spares",
            )
        cut = len(self.nodes) - spares
        return self.nodes[:cut], self.nodes[cut:]

    @property
    def key(self) -> str:
        """What names the job across requeues: an array task's own id, else the job id."""
        if self.array_job_id and self.array_task_id:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id


def in_allocation(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether `ftrun launch` with no hosts should run on the allocation: in a batch script or
    an salloc shell (not inside a step, where SLURM_STEP_ID is set: that is one node's task),
    with Slurm's commands at hand (a container in a job may lack them)."""
    path = environ.get("PATH")
    return (
        bool(environ.get("SLURM_JOB_ID"))
        and environ.get("SLURM_STEP_ID") in (None, "", "batch")
        and shutil.which("srun", path=path) is not None
        and shutil.which("scontrol", path=path) is not None
    )


def read_allocation(environ: Mapping[str, str] = os.environ) -> Allocation:
    """The allocation of this batch step (or salloc shell), from Slurm's variables."""
    job_id = environ.get("SLURM_JOB_ID", "")
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST", "")
    if not job_id or not nodelist:
        raise UsageError(
            "--slurm needs a Slurm allocation, and SLURM_JOB_ID or SLURM_JOB_NODELIST is not set",
            hint="run it inside sbatch or salloc, or submit with `ftrun sbatch`",
        )
    nodes = tuple(scontrol("show", "hostnames", nodelist, environ=environ).split())
    return Allocation(
        job_id=job_id,
        nodes=nodes,
        gpus_per_node=_int(environ.get("SLURM_GPUS_ON_NODE")),
        restart_count=_int(environ.get("SLURM_RESTART_COUNT")) or 0,
        array_job_id=environ.get("SLURM_ARRAY_JOB_ID"),
        array_task_id=environ.get("SLURM_ARRAY_TASK_ID"),
    )


def node_state(node: str, environ: Mapping[str, str] = os.environ) -> str:
    """The node's base state as scontrol shows it: IDLE, ALLOCATED, MIXED, DOWN, DRAIN…
    (flags such as `+DRAIN` and `*` stripped)."""
    state = node_fields(node, environ=environ).get("State", "UNKNOWN")
    return state.split("+")[0].rstrip("*~#!%$@^-")


def node_address(node: str, environ: Mapping[str, str] = os.environ) -> str:
    """The address Slurm reaches the node at (NodeAddr, which defaults to its name)."""
    return node_fields(node, environ=environ).get("NodeAddr") or node


def dial_address(node_addr: str) -> str:
    """Our own address on the route to `node_addr`: what an agent on that node dials back.
    Connecting a UDP socket sends nothing; it only asks the kernel which source it would use."""
    try:
        target = socket.gethostbyname(node_addr)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target, 9))
            return str(s.getsockname()[0])
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None
