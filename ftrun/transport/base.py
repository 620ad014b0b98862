"""The transport interface: start an agent on a host, and make sure it is gone."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ftrun.bootstrap import Bootstrap


class AgentHandle(Protocol):
    host: str

    @property
    def returncode(self) -> int | None: ...

    def alive(self) -> bool | None:
        """True when the agent's process is known to run, False when it is known gone, None when
        the transport cannot tell. True keeps a silent agent from being declared lost."""

    async def terminate(self, timeout_s: float) -> None:
        """Make sure the agent and everything it started on its host are gone."""


class Transport(Protocol):
    def bind_address(self) -> str:
        """Where the controller listens so that agents started by this transport reach it."""

    async def start_agent(self, boot: Bootstrap, *, log_path: Path) -> AgentHandle:
        """Start the agent for boot.host; the bootstrap (with the job secret) goes on stdin.
        The transport fills in boot.controller_host: the address that host dials.
        Raises FtrunError (with the transport's own error) when the host cannot be reached."""
