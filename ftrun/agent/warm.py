"""The agent's side of the warm start: it starts the warm interpreter (zygote.py), knows whether
it listens, says so when it does not, and kills it at the end.

Without a warm interpreter nothing breaks: the shims find no socket to ask and start torchrun and
the ranks cold, as plain torchrun would. That is exactly why a failure here must not be quiet:
restarts would only be slower, and nobody would know why. So a warm interpreter that does not
listen within ZYGOTE_START_TIMEOUT_S, or that dies later, is a WarmStartFailed that the agent
reports to the controller (an `agent_error`, journaled, and a notice for the user), and the ranks
start cold until the next launch starts a new one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from ftrun import envcontract
from ftrun.agent import proctitle
from ftrun.bootstrap import Bootstrap

log = logging.getLogger("ftrun.agent")

# From start to listening is an interpreter start and a few small imports (the zygote listens
# before it imports torch). Shims that ask while it imports torch wait for it (rank_shim.py).
ZYGOTE_START_TIMEOUT_S = 10.0
ZYGOTE_POLL_INTERVAL_S = 0.01
ZYGOTE_EXIT_TIMEOUT_S = 5.0


class WarmStartFailed(Exception):
    """The warm interpreter does not serve: this host's ranks start cold."""


class WarmInterpreter:
    """One zygote process at a time, listening on `sock_path`. `report` hears of a zygote that
    died while the agent still needed it."""

    def __init__(
        self, boot: Bootstrap, sock_path: Path, *, report: Callable[[WarmStartFailed], None]
    ) -> None:
        self.boot = boot
        self.sock_path = sock_path
        self.proc: asyncio.subprocess.Process | None = None
        self._report = report
        self._closing = False

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    async def start(self) -> WarmStartFailed | None:
        """Start a zygote and wait until it listens: None when it does, else why not. The
        ranks start cold while it does not; the caller says so."""
        # A dead zygote's socket file would look like a listening one.
        self.sock_path.unlink(missing_ok=True)
        try:
            self.proc = proc = await asyncio.create_subprocess_exec(
                # The padding argument and variable are room for each fork's own command line
                # and environment (proctitle.py).
                self.boot.python,
                "-m",
                "ftrun.agent.zygote",
                str(self.sock_path),
                proctitle.title_room(),
                stdin=asyncio.subprocess.PIPE,
                start_new_session=True,
                env={
                    **os.environ,
                    **proctitle.env_room(),
                    envcontract.AGENT_ID: self.boot.process_tag,
                    **(
                        {envcontract.ZYGOTE_PRELOAD: self.boot.zygote_preload}
                        if self.boot.zygote_preload
                        else {}
                    ),
                },
            )
        except OSError as e:
            self.proc = None
            return WarmStartFailed(
                f"cannot start the warm interpreter ({self.boot.python}): "
                f"{e}; ranks here start cold"
            )
        deadline = time.monotonic() + ZYGOTE_START_TIMEOUT_S
        while not self.sock_path.exists():
            if proc.returncode is not None:
                return WarmStartFailed(
                    f"the warm interpreter exited with code {proc.returncode} before it "
                    f"listened (its output is in the agent's log); ranks here start cold"
                )
            if time.monotonic() >= deadline:
                return WarmStartFailed(
                    f"the warm interpreter did not listen within {ZYGOTE_START_TIMEOUT_S:g} s; "
                    f"ranks here start cold until it does"
                )
            await asyncio.sleep(ZYGOTE_POLL_INTERVAL_S)
        return None

    async def watch(self) -> None:
        """Wait for the current zygote to exit; report it unless the agent is closing."""
        proc = self.proc
        if proc is None:
            return
        code = await proc.wait()
        if not self._closing and proc is self.proc:
            self._report(
                WarmStartFailed(
                    f"the warm interpreter exited with code {code} (its output is in the agent's "
                    f"log); ranks here start cold until the next generation starts a new one"
                )
            )

    async def close(self) -> None:
        """Kill it and reap it (idempotent). Its forks die with it (PR_SET_PDEATHSIG)."""
        self._closing = True
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            try:
                await asyncio.wait_for(self.proc.wait(), ZYGOTE_EXIT_TIMEOUT_S)
            except asyncio.TimeoutError:
                # Stuck in the kernel (D state): waiting longer would only hold the agent's
                # exit, and its ranks are already dead.
                log.error("the warm interpreter (pid %s) survived SIGKILL", self.proc.pid)
