"""Where a generation's ranks meet: each agent's address (from its hello) and a free port its
host offered (in its hello, and again after each stop), node rank 0's becoming torchrun's master
address and port; and, from those, the launch each agent is sent for a generation.

Its own module because it is bookkeeping about rendezvous, not about agents' lives: the fleet
starts, loses and retries agents and feeds this what they say; this holds no I/O but the pick
of a free port, and builds what the fleet sends.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftrun import envcontract
from ftrun.config import LaunchConfig
from ftrun.controller.peer_plan import peer_fields
from ftrun.netutil import LOOPBACK, free_port


@dataclass(frozen=True)
class Launch:
    """One generation's launch: the master the ranks meet at and each agent's message."""

    master_addr: str | None  # None: node rank 0's agent never said where it is
    master_port: int
    messages: list[dict[str, Any]]  # by node rank


class Rendezvous:
    def __init__(self, config: LaunchConfig) -> None:
        self.config = config
        self.addrs: dict[str, str] = {}  # agent id → its address (rendezvous host if node rank 0)
        self.ports: dict[str, int] = {}  # agent id → a free port on its host, for the rendezvous
        self.peer_stores: dict[str, tuple[str, int]] = {}  # agent id → its peer store (peercopy)
        self.previous: list[str] = []  # the last generation's agents, by node rank

    def heard(self, agent_id: str, msg: dict[str, Any]) -> None:
        """A port the agent's host offers (hello, stopped): the next rendezvous may bind it."""
        if isinstance(msg.get("port"), int):
            self.ports[agent_id] = msg["port"]

    def connected(self, agent_id: str, msg: dict[str, Any]) -> str:
        """The hello of the host's current agent: where it is; returns that address."""
        self.addrs[agent_id] = str(msg.get("addr") or "127.0.0.1")
        if isinstance(msg.get("peer_port"), int):
            self.peer_stores[agent_id] = (self.addrs[agent_id], msg["peer_port"])
        return self.addrs[agent_id]

    def forget(self, agent_id: str) -> None:
        self.addrs.pop(agent_id, None)
        self.ports.pop(agent_id, None)
        self.peer_stores.pop(agent_id, None)

    def launch(
        self,
        number: int,
        agents: list[str],
        *,
        hang: dict[str, Any],
        restarts: int,
        job_dir: Path,
        env: dict[str, str],
    ) -> Launch:
        """Generation `number` on `agents` (node rank by position), with the hang detector's
        settings `hang` (a HangPolicy as the agents take it) and `env` for every rank."""
        cfg = self.config
        master = agents[0]
        # A port the rendezvous host offered (it binds there), else one picked here.
        port = cfg.master_port or self.ports.pop(master, None) or free_port(LOOPBACK)
        # ftrun's variables for the ranks. The TORCHELASTIC_ ones replace torchrun's own
        # (always 0: it never restarts under ftrun) in the rank shim.
        env = {
            envcontract.JOB_DIR: str(job_dir),
            envcontract.RESTART_COUNT: str(restarts),
            envcontract.MAX_RESTARTS: str(cfg.max_restarts),
            **env,
        }
        peers = peer_fields(
            agents,
            self.previous,
            self.peer_stores,
            nproc_per_node=cfg.nproc_per_node,
            rate_bytes_s=cfg.peer_copy_mbps * 1e6,
        )
        self.previous = list(agents)
        messages = [
            {
                "gen": number,
                "nnodes": len(agents),
                "node_rank": node_rank,
                "nproc_per_node": cfg.nproc_per_node,
                "master_addr": self.addrs.get(master, "127.0.0.1"),
                "master_port": port,
                "entrypoint": cfg.entrypoint(),
                "cwd": cfg.cwd,
                "progress_regex": cfg.progress_regex,
                "hang": hang,
                "idle_timeout_s": cfg.idle_timeout_s,
                "env": env,
                "peer": peers[node_rank],
            }
            for node_rank in range(len(agents))
        ]
        return Launch(self.addrs.get(master), port, messages)
