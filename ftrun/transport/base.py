"""The transport interface: start an agent on a host, and make sure it is gone."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ftrun.agent.agent import Bootstrap


class AgentHandle(Protocol):
    host: str

    @property
    def returncode(self) -> int | None: ...

    async def terminate(self, timeout_s: float) -> None:
        """Make sure the agent and everything it started on its host are gone."""


class Transport(Protocol):
    def controller_address(self) -> str:
        """The address agents started by this transport dial to reach the controller."""

    async def start_agent(self, boot: Bootstrap, *, log_path: Path) -> AgentHandle:
        """Start the agent for boot.host; the bootstrap (with the job secret) goes on stdin."""
