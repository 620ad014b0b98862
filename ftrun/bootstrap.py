"""The agent's bootstrap: what the controller hands each agent when a transport starts it.

One JSON line on the agent's stdin, never a command line: it holds the job secret, and a command
line is readable by every user of the host. The controller (fleet.py) fills it in, a transport
(local, ssh) delivers it, the agent reads it; so it is part of the wire contract, beside
protocol.py, and sits on the ground floor where all three can import it without an arrow that
runs up. Ground floor: imports nothing of ftrun.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field

# What a launcher writes on an agent's stdin to terminate it on purpose (plain EOF may only mean
# the launcher died, and the agent then waits for a controller to come back: agent/link.py).
FENCE_WORD = b"fence"


@dataclass(frozen=True, kw_only=True)
class Bootstrap:
    """What the controller hands an agent on stdin (not a command line: it holds secrets)."""

    controller_host: str
    controller_port: int
    secret: str
    job_id: str
    agent_id: str
    host: str
    heartbeat_interval_s: float
    fence_timeout_s: float
    warm_start: bool
    # How long the agent keeps its ranks once the controller is gone (its connection closed,
    # or silent for fence_timeout_s), reconnecting, before it fences: the window in which
    # `ftrun resume` adopts the running generation. 0: fence at once (under Slurm, where the
    # step dies with its srun anyway).
    controller_grace_s: float = 0.0
    python: str = sys.executable
    # Environment the launcher forwards (NCCL_*, PYTHON*, ...): over ssh nothing is inherited.
    env: dict[str, str] = field(default_factory=dict)
    # What the warm interpreter imports ahead of the first rank; empty: its default list.
    zygote_preload: str = ""
    # Started by the local transport: the controller is our parent, on this host.
    local: bool = False
    # The controller's TLS certificate (PEM), the only one the agent trusts; "" on loopback,
    # where the connection is plain (tls.py).
    controller_cert: str = ""
    # The job's checkpoint key (hex): the agent gives it to every rank as FTRUN_CHECKPOINT_KEY,
    # and ftrun.checkpoint authenticates its pickles and manifests with it. A secret, like
    # `secret`; the same for the job's whole life (controller/jobkey.py). Empty: none.
    checkpoint_key: str = field(default="", repr=False)
    # The umask the agent, and so every rank, runs with: 0o077 (files 0600, directories
    # 0700), or 0o027 with --group-readable (LaunchConfig.umask).
    umask: int = 0o077
    # Under Slurm with --requeue: the Slurm job this agent requeues when it loses its controller
    # and Slurm says the batch node is gone (agent/slurm_requeue.py), and the run's
    # SLURM_RESTART_COUNT, so that a later run of the job is never requeued by mistake.
    slurm_requeue_job: str = ""
    slurm_restart_count: int = 0
    # The term of the controller that started this agent (its run of the job: terms.py). A host
    # that obeys a newer term refuses this agent, and it ignores `fence` on its stdin then.
    term: int = 1

    @property
    def process_tag(self) -> str:
        """The FTRUN_AGENT_ID every process of this agent carries, and that its sweeps kill by.
        Unique per job: agent ids (host#N) repeat across jobs, and two jobs on one host must
        never sweep each other's processes."""
        return f"{self.job_id}/{self.agent_id}"

    @classmethod
    def from_json(cls, text: str) -> Bootstrap:
        return cls(**json.loads(text))
