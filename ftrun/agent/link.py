"""The agent's control link: its one connection to the controller, the heartbeats on it, and
fencing when the controller is gone.

If the controller goes silent for fence_timeout_s, or its connection or our stdin closes, the
agent kills everything it started and exits: a partitioned host never trains on as a zombie.
A local agent (the controller is its parent on this host) does not fence on silence alone: the
controller's death closes our stdin at once, and a silent but living controller is only slow.
The link decides that the controller is gone; the agent (agent.py) does the fencing.

Whatever the ranks write, what goes over the connection is bounded (lines.py, tail.py), and a
message that still does not fit a frame is sent cut short rather than lost. Waiting for sent
bytes to leave is bounded too: a controller that stops reading must not hold the agent.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ftrun.agent.lines import shrunk
from ftrun.agent.stallguard import StallGuard
from ftrun.bootstrap import Bootstrap
from ftrun.errors import ProtocolError
from ftrun.protocol import Channel, open_channel

log = logging.getLogger("ftrun.agent")

# How long flush() waits for what was sent to leave. A report that must go before a
# self-inflicted fault (chaos) waits this long at most; past it the controller is not reading.
FLUSH_TIMEOUT_S = 5.0
# What the agent says before its hello (a warm interpreter that did not start) waits for the
# hello, since the controller accepts nothing before it; this many messages at most.
MAX_EARLY_MESSAGES = 64


class ControlLink:
    """The connection to the controller. `fence(reason)` is called once the controller is gone:
    its connection closed, or (for a remote agent) it has been silent for fence_timeout_s."""

    def __init__(self, boot: Bootstrap, *, fence: Callable[[str], None]) -> None:
        self.boot = boot
        self._fence = fence
        self.chan: Channel | None = None
        self.last_heard = time.monotonic()
        self._early: list[tuple[str, dict[str, Any]]] = []

    async def open(self, *, port: int) -> None:
        """Connect, authenticate and say hello; raises OSError or TimeoutError when the
        controller cannot be reached within fence_timeout_s. `port` is a free port of this
        host, in case the controller makes us the rendezvous host (node rank 0)."""
        self.chan = await open_channel(
            self.boot.controller_host,
            self.boot.controller_port,
            self.boot.secret,
            timeout_s=self.boot.fence_timeout_s,
            cert_pem=self.boot.controller_cert,
        )
        # Our end of the control connection is an address the other hosts can reach too:
        # the controller makes it the rendezvous address when we are node rank 0.
        self.chan.send(
            "hello",
            agent_id=self.boot.agent_id,
            host=self.boot.host,
            pid=os.getpid(),
            addr=self.chan.writer.get_extra_info("sockname")[0],
            port=port,
        )
        self.last_heard = time.monotonic()
        early, self._early = self._early, []
        for kind, fields in early:
            self.send(kind, **fields)

    async def receive(self) -> dict[str, Any] | None:
        """The controller's next message; None once its connection is lost (fence was called).
        A message that fails the protocol's checks is dropped and logged."""
        assert self.chan is not None
        while True:
            try:
                msg = await self.chan.receive()
            except ProtocolError as e:
                log.warning("dropped a message from the controller: %s", e)
                continue
            except (asyncio.IncompleteReadError, ConnectionError, OSError) as e:
                self._fence(f"lost the controller connection ({e.__class__.__name__})")
                return None
            self.last_heard = time.monotonic()
            return msg

    async def heartbeat_loop(self, generation: Callable[[], int | None]) -> None:
        """Heartbeat every heartbeat_interval_s (with the generation running here), and fence
        after fence_timeout_s without a word from the controller. Returns once fenced."""
        assert self.chan is not None
        check = StallGuard()
        warned = False
        while True:
            self.chan.send("heartbeat", gen=generation())
            silent = time.monotonic() - self.last_heard
            if check.due() and silent > self.boot.fence_timeout_s:
                if not self.boot.local:
                    self._fence(f"no word from the controller for {silent:.1f} s")
                    return
                if not warned:
                    log.warning(
                        "no word from the controller for %.1f s; not fencing: it runs "
                        "on this host, and its exit would close our stdin",
                        silent,
                    )
                warned = True
            elif silent <= self.boot.fence_timeout_s:
                warned = False
            await check.sleep(self.boot.heartbeat_interval_s)

    def send(self, kind: str, **fields: Any) -> None:
        """Send a message; one too big for a frame (a bug: reports are bounded) is sent with
        every field cut short rather than lost, and said so. Before the hello, it waits for it."""
        if self.chan is None:
            if len(self._early) < MAX_EARLY_MESSAGES:
                self._early.append((kind, fields))
            else:
                log.error("not connected yet; dropped a %s message", kind)
            return
        try:
            self.chan.send(kind, **fields)
        except ProtocolError as e:
            log.error("%s message too big (%s); sending it cut short", kind, e)
            self.chan.send(kind, **shrunk(fields), shrunk=str(e))

    def unsent_bytes(self) -> int:
        """Bytes queued on the connection that the controller has not taken yet."""
        if self.chan is None or self.chan.writer.transport is None:
            return 0
        return self.chan.writer.transport.get_write_buffer_size()

    async def flush(self, timeout_s: float = FLUSH_TIMEOUT_S) -> bool:
        """Wait until what was sent has left, at most timeout_s; False when it had not."""
        if self.chan is None:
            return False
        try:
            await self.chan.drain(timeout_s)
        except asyncio.TimeoutError:
            log.warning(
                "the controller has not taken %d bytes in %.1f s", self.unsent_bytes(), timeout_s
            )
            return False
        return True

    def close(self) -> None:
        if self.chan is not None:
            self.chan.close()


def watch_stdin(loop: asyncio.AbstractEventLoop, on_eof: Callable[[], None]) -> threading.Thread:
    """Call on_eof (in the loop) at EOF on stdin: the process that started us (controller, ssh,
    srun) is gone. Returns the watching thread, a daemon: it blocks in read() until then."""

    def wait_eof() -> None:
        # The raw fd, not sys.stdin: a daemon thread blocked inside a buffered reader makes
        # interpreter shutdown abort ("could not acquire lock ... at interpreter shutdown").
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        loop.call_soon_threadsafe(on_eof)

    thread = threading.Thread(target=wait_eof, name="stdin-watch", daemon=True)
    thread.start()
    return thread
