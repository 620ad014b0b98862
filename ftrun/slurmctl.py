"""Slurm's client commands, as ftrun calls them: `scontrol` with a timeout, its one-line output
read as KEY=VALUE fields, and `scontrol requeue`.

On the ground floor because both sides use it: the Slurm transport and the CLI (the allocation,
`ftrun status`, a requeue after a preemption notice), and the agent (agent/slurm_requeue.py:
a job whose batch node is lost is requeued from a surviving node). Every command runs with a
timeout and fails as one SlurmError that carries Slurm's own message. Imports nothing of ftrun
but errors.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping

from ftrun.errors import FtrunError

SCONTROL_TIMEOUT_S = 15.0


class SlurmError(FtrunError):
    """A Slurm command failed or is missing: the message carries Slurm's own words."""


def requeue(job_id: str, environ: Mapping[str, str] = os.environ) -> None:
    """Put the job back in the queue: Slurm ends this run of it and starts it again later."""
    scontrol("requeue", job_id, environ=environ)


def job_fields(job_id: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """`scontrol show job -o`'s KEY=VALUE fields (JobState, NodeList, BatchHost, Restarts, …)."""
    return fields(scontrol("show", "job", "-o", job_id, environ=environ))


def node_fields(node: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """`scontrol show node -o`'s KEY=VALUE fields (State, NodeAddr, …)."""
    return fields(scontrol("show", "node", "-o", node, environ=environ))


def scontrol(*args: str, environ: Mapping[str, str] = os.environ) -> str:
    exe = shutil.which("scontrol", path=environ.get("PATH"))
    if exe is None:
        raise SlurmError(
            "scontrol not found: ftrun --slurm needs the Slurm client commands",
            hint="run it on a node of the Slurm cluster, with Slurm's bin directory on PATH",
        )
    try:
        done = subprocess.run(
            [exe, *args],
            capture_output=True,
            text=True,
            timeout=SCONTROL_TIMEOUT_S,
            env=dict(environ),
        )
    except subprocess.TimeoutExpired:
        raise SlurmError(
            f"`scontrol {' '.join(args)}` did not answer within {SCONTROL_TIMEOUT_S:g} s",
            hint="is slurmctld up? try `scontrol ping`",
        ) from None
    if done.returncode != 0:
        raise SlurmError(
            f"`scontrol {' '.join(args)}` failed: {(done.stderr or done.stdout).strip()}",
            hint="try the command by hand; `scontrol ping` checks slurmctld",
        )
    return done.stdout


def fields(line: str) -> dict[str, str]:
    """KEY=VALUE KEY=VALUE … (one-line scontrol output) → a dict; a value ends at a space."""
    out: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            out[key] = value
    return out
