"""The local transport: the agent is a subprocess of the controller on this machine.

It is still its own process in its own session, reached over the same authenticated TCP
connection as a remote agent, so multi-host is another transport, not another design.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import sys
from typing import IO

from ftrun.agent import procs
from ftrun.bootstrap import Bootstrap
from ftrun.errors import HostUnreachable
from ftrun.transport import child
from ftrun.transport.escalate import escalate


class LocalAgent:
    def __init__(self, host: str, process_tag: str, proc: asyncio.subprocess.Process) -> None:
        self.host = host
        self.process_tag = process_tag
        self.proc = proc

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def alive(self) -> bool:
        # Our own child: its exit status is the truth (a SIGSTOPped or starved agent is alive).
        return self.proc.returncode is None

    async def terminate(self, timeout_s: float) -> None:
        # The agent was told to shut down; if it does not, closing its stdin makes it fence
        # itself (kill its processes and exit); if even that fails, SIGKILL.
        if not await escalate(self.proc.wait, [None, self._close_stdin], timeout_s):
            procs.killpg_quietly(self.proc.pid, signal.SIGKILL)
            await self.proc.wait()
        self._close_stdin()
        # Whatever the agent could not kill (it was SIGKILLed, say), we do.
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: procs.kill_all([], self.process_tag, timeout_s=timeout_s)
        )

    def _close_stdin(self) -> None:
        child.close_stdin(self.proc)


class LocalTransport:
    def __init__(self, python: str = sys.executable) -> None:
        self.python = python

    def bind_address(self) -> str:
        return "127.0.0.1"

    async def start_agent(self, boot: Bootstrap, *, log: IO[bytes]) -> LocalAgent:
        boot = dataclasses.replace(boot, controller_host="127.0.0.1", local=True)
        proc = await child.spawn(
            [self.python, "-m", "ftrun.agent"],
            boot,
            log=log,
            fail=lambda why: HostUnreachable(
                boot.host,
                f"could not start the agent with {self.python}: {why}",
                hint="the local agent runs with the Python that runs "
                "ftrun: check that it is still installed",
            ),
        )
        agent = LocalAgent(boot.host, boot.process_tag, proc)
        await child.send_bootstrap(
            proc,
            boot,
            terminate=agent.terminate,
            fail=lambda why: HostUnreachable(
                boot.host, f"the agent did not read its bootstrap ({why})"
            ),
        )
        return agent
