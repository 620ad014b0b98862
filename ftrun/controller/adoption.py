"""Taking over a generation whose controller died (`ftrun resume JOB` within the agents' grace).

The agents of a job whose controller died keep their ranks for `--controller-grace` and dial
the controller's address again and again (agent/link.py). A resumed controller that comes up
in time, on the same port, with the same secret and the same TLS certificate, hears them say
hello again with the generation they run. If every agent of the running generation is back
with it, the controller adopts the generation: no rank was restarted, no step lost. Otherwise
the resume goes on as after the grace: the next generation, from the freshest checkpoint.

What the old controller left for this: `control.json` (port and secret, 0600), `control.tls`
(its key and certificate, 0600, only between hosts), and the journal: the running generation's
hosts in node-rank order (`generation_launched`) and each host's agent (`agent_connected`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftrun import tls
from ftrun.config import LaunchConfig
from ftrun.jobfiles import JobDir
from ftrun.journal.read import ResumePoint

CONTROL_FILE = "control.json"
TLS_FILE = "control.tls"
# How long a resumed controller waits for the running generation's agents (they retry every
# 2 s at most): long enough for all of them, short enough that a failed adoption costs little.
ADOPT_WAIT_S = 10.0


@dataclass(frozen=True)
class Adoption:
    """A running generation a resumed controller may take over, and how to be found by it."""

    gen: int
    hosts: list[str]  # by node rank
    agents: dict[str, str]  # host → agent id
    port: int
    secret: str = field(repr=False)
    identity: tls.Identity | None = field(repr=False)
    first_step_seen: bool
    grace_left_s: float
    # The job's other live agents (spares, hosts back after a loss): host → agent id. They
    # dial back too, and are kept: without them the next lost host would shrink the job.
    spares: dict[str, str] = field(default_factory=dict)
    # A standby's takeover (docs/standby.md): it adopts only if most of the generation's agents
    # come to it; fewer means the primary still has them, and the standby stands down.
    takeover: bool = False
    # When the standby's agent took the primary for gone (its verdict: the incident's detection).
    lost_at: float | None = None

    @property
    def wait_s(self) -> float:
        return max(1.0, min(ADOPT_WAIT_S, self.grace_left_s))


def adoption_of(
    config: LaunchConfig, point: ResumePoint, events: list[dict[str, Any]], *, now: float
) -> Adoption | None:
    """The generation to adopt, if one can be: its controller died (not a stop or a
    preemption), less than the grace ago, and the job's agents can outlive it (not Slurm,
    not a planned job, whose plan desk is not rebuilt yet)."""
    job_dir = config.job_dir
    if point.finished is not None or point.running is None or point.last_t is None:
        return None
    if config.transport not in ("local", "ssh") or config.planned:
        return None
    grace_left = config.controller_grace_s - (now - point.last_t)
    if grace_left <= 0:
        return None
    control = _read_json(job_dir / CONTROL_FILE)
    if not isinstance(control.get("port"), int) or not isinstance(control.get("secret"), str):
        return None
    identity = None
    if control.get("cert"):
        identity = load_identity(job_dir)
        if identity is None or identity.cert_pem != control["cert"]:
            return None
    hosts: list[str] = []
    agents: dict[str, str] = {}
    gone: set[str] = set()  # hosts lost or removed since their agent last connected
    first_step = False
    for ev in events:
        kind, host = ev.get("kind"), str(ev.get("host"))
        if kind == "generation_launched" and ev.get("gen") == point.running:
            hosts = [h for h in ev.get("hosts") or [] if isinstance(h, str)]
        elif kind == "agent_connected" and isinstance(ev.get("agent"), str):
            agents[host] = ev["agent"]
            gone.discard(host)
        elif kind == "first_step" and ev.get("gen") == point.running:
            first_step = True
        elif (kind == "fault_detected" and ev.get("fault") == "host-lost") or kind in (
            "host_removed",
            "host_unreachable",
        ):
            gone.add(host)
    if not hosts or any(h not in agents for h in hosts):
        return None
    return Adoption(
        gen=point.running,
        hosts=hosts,
        agents={h: agents[h] for h in hosts},
        port=control["port"],
        secret=control["secret"],
        identity=identity,
        first_step_seen=first_step,
        grace_left_s=grace_left,
        spares={h: a for h, a in agents.items() if h not in hosts and h not in gone},
    )


def save_identity(files: JobDir, identity: tls.Identity) -> None:
    """Keep the controller's TLS key and certificate for a resumed controller (agents trust
    this certificate only). 0600, like control.json and its secret; never through a link."""
    body = {"cert": identity.cert_pem, "key": identity.key_pem}
    files.replace(TLS_FILE, json.dumps(body).encode(), mode=0o600)


def load_identity(job_dir: Path) -> tls.Identity | None:
    body = _read_json(job_dir / TLS_FILE)
    if isinstance(body.get("cert"), str) and isinstance(body.get("key"), str):
        return tls.Identity(cert_pem=body["cert"], key_pem=body["key"])
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            body = json.loads(f.read(1 << 20))
    except (OSError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}
