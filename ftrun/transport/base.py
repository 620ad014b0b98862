"""The transport interface: start an agent on a host, and make sure it is gone."""

from __future__ import annotations

from typing import IO, Protocol

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

    async def start_agent(self, boot: Bootstrap, *, log: IO[bytes]) -> AgentHandle:
        """Start the agent for boot.host; the bootstrap (with the job secret) goes on stdin, its
        output (or the transport's) into `log`, which stays the caller's: a transport keeps a
        duplicate of it, never opens the log by its path (ftrun/jobfiles.py).
        The transport fills in boot.controller_host: the address that host dials.
        Raises FtrunError (with the transport's own error) when the host cannot be reached."""
