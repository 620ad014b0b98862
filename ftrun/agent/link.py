"""The agent's control link: its one connection to the controller, the heartbeats on it, and
what happens when the controller is gone.

The controller is gone when its connection closes, or (for a remote agent) when it has been
silent for fence_timeout_s and its machine no longer acknowledges what we send (peer_kernel.py;
one that still does is slow, and waited for). Then, with a `controller_grace_s` (the default under `ftrun launch`),
the agent keeps its ranks training and reconnects, with back-off, to the same address: a new
controller started by `ftrun resume` adopts the running generation there. It fences (kills
everything it started and exits) when the grace runs out, or at once when a controller says
so: a `fence` message (it dropped us: a partition healed), or the word `fence` on our stdin
(the launcher terminating us on purpose). Plain EOF on stdin is only a hint: the launcher may
have died, and its connection decides. Without a grace the agent fences at once, as before.
A partitioned host's ranks may live on for the grace; generation claims keep anything they
write from reaching the job (docs/fencing.md).

A local agent (the controller is its parent on this host) does not take silence alone for the
controller gone: a silent but living controller is only slow.
The link decides that the controller is gone; the agent (agent.py) does the fencing.

Whatever the ranks write, what goes over the connection is bounded (lines.py, tail.py), and a
message that still does not fit a frame is sent cut short rather than lost. The output and the
once-only facts (unacked.py) are numbered and kept until a controller acknowledges them (its
heartbeats carry `acked`); on every connection they are sent again first, so what went into a
dead controller's socket reaches the next one. Other messages said while there is no connection
wait (at most MAX_EARLY_MESSAGES) and go out after them.
Waiting for sent bytes to leave is bounded too: a controller that stops reading must not hold
the agent.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ftrun import peer_kernel
from ftrun.agent import host_facts, tiers, workdir
from ftrun.agent.lines import shrunk
from ftrun.agent.stallguard import StallGuard
from ftrun.agent.unacked import REPLAYED, UnackedRing
from ftrun.bootstrap import FENCE_WORD, Bootstrap
from ftrun.errors import ProtocolError
from ftrun.netutil import ALL_INTERFACES, free_port
from ftrun.wire.protocol import Channel, open_channel

log = logging.getLogger("ftrun.agent")

# How long flush() waits for what was sent to leave. A report that must go before a
# self-inflicted fault (chaos) waits this long at most; past it the controller is not reading.
FLUSH_TIMEOUT_S = 5.0
# What the agent says before its hello (a warm interpreter that did not start), or while it is
# without a controller, waits for the next hello; this many messages at most.
MAX_EARLY_MESSAGES = 256
# Reconnecting to a controller that is gone: the first wait, the longest, and how long one
# attempt (TCP, TLS, keys, hello) may take.
REJOIN_FIRST_S = 0.25
REJOIN_CAP_S = 2.0
REJOIN_ATTEMPT_S = 3.0
# With a standby to dial in turn, an attempt on the primary is cut shorter: a machine that lost
# power never answers, and the turn of the standby (which does) should not wait on it.
REJOIN_ATTEMPT_WITH_STANDBY_S = 1.0
# A silent controller whose machine still acknowledges us (peer_kernel.py) is waited for this
# long at most (and half the grace at most) before it is taken for gone after all.
SLOW_CONTROLLER_LIMIT_S = 30.0


class ControlLink:
    """The connection to the controller. `fence(reason)` is called once the controller is gone
    for good: no controller came back within the grace, or one told us to fence."""

    def __init__(
        self,
        boot: Bootstrap,
        *,
        fence: Callable[[str], None],
        generation: Callable[[], int | None] = lambda: None,
    ) -> None:
        self.boot = boot
        self._fence = fence
        self._generation = generation
        self.chan: Channel | None = None
        self.last_heard = time.monotonic()
        self._early: list[tuple[str, dict[str, Any]]] = []
        self.unacked = UnackedRing()  # output not yet acknowledged: sent again after a loss
        self.rejoining = False
        self.peer_port: int | None = None  # where this agent's peer store listens, if it does
        # Why the controller was lost, if it was (gone or silent, never told us to stop): under
        # Slurm the agent then checks whether the batch node is lost (slurm_requeue.py).
        self.lost: str | None = None
        # Where the standby controller listens (agent/standby.py): dialled in turn with the
        # primary's address while the controller is gone. And what to do when it goes.
        self.standby: tuple[str, int] | None = None
        self.on_controller_gone: Callable[[], None] = lambda: None
        self._slow_said = False  # said once per silence that the controller is only slow

    async def open(
        self, *, port: int, rejoin: bool = False, to: tuple[str, int] | None = None
    ) -> None:
        """Connect, authenticate and say hello; raises OSError or TimeoutError when the
        controller cannot be reached in time. `port` is a free port of this host, in case the
        controller makes us the rendezvous host (node rank 0). `to`: another address than the
        primary's (the standby's)."""
        host, cport = to or (self.boot.controller_host, self.boot.controller_port)
        self.chan = await open_channel(
            host,
            cport,
            self.boot.secret,
            timeout_s=self._attempt_s(to) if rejoin else self.boot.fence_timeout_s,
            cert_pem=self.boot.controller_cert,
        )
        # Our end of the control connection is an address the other hosts can reach too:
        # the controller makes it the rendezvous address when we are node rank 0.
        extra: dict[str, Any] = {"rejoin": True, "gen": self._generation()} if rejoin else {}
        self.chan.send(
            "hello",
            agent_id=self.boot.agent_id,
            host=self.boot.host,
            pid=os.getpid(),
            addr=self.chan.writer.get_extra_info("sockname")[0],
            port=port,
            peer_port=self.peer_port,
            **tiers.space(workdir.SHM),  # the memory tier's room (controller/fleet.py)
            **host_facts.facts(),  # Python, torch, the clock: checked (controller/host_checks.py)
            **extra,
        )
        self.last_heard = time.monotonic()
        self.rejoining = False  # connected: what waited goes out now, after the hello
        self._replay()
        early, self._early = self._early, []
        for kind, fields in early:
            self.send(kind, **fields)

    def _replay(self) -> None:
        """Send again what no controller acknowledged (a controller that has it drops it), and
        say how many were dropped unacknowledged since the last connection (unacked.py)."""
        for entry in self.unacked.pending():
            self._send_now(entry.kind, entry.fields)
        if dropped := self.unacked.untold:
            self.unacked.untold = 0
            note = f"[ftrun: {dropped} output messages of {self.boot.host} were dropped before a"
            note += " controller acknowledged them; the rank logs on that host have every line]"
            self.send("log", gen=self._generation(), rank=None, lines=[note])

    def _attempt_s(self, to: tuple[str, int] | None) -> float:
        if self.standby is not None and to is None:
            return REJOIN_ATTEMPT_WITH_STANDBY_S
        return REJOIN_ATTEMPT_S

    async def receive(self) -> dict[str, Any] | None:
        """The controller's next message; None once the agent fences (fence was called).
        A message that fails the protocol's checks is dropped and logged. A lost connection is
        rejoined within the grace."""
        while True:
            if self.chan is None:
                return None
            try:
                msg = await self.chan.receive()
            except ProtocolError as e:
                log.warning("dropped a message from the controller: %s", e)
                continue
            except (asyncio.IncompleteReadError, ConnectionError, OSError) as e:
                if await self._rejoin(f"lost the controller connection ({e.__class__.__name__})"):
                    continue
                return None
            self.last_heard = time.monotonic()
            if (acked := msg.get("acked")) is not None:
                self.unacked.ack(acked)
            if msg["kind"] == "fence":
                self._fence(f"the controller says: {msg.get('reason') or 'fence'}")
                return None
            return msg

    async def _rejoin(self, reason: str) -> bool:
        """The controller is gone: keep the ranks, and reconnect until one answers (True) or
        the grace runs out (fence, False)."""
        grace = self.boot.controller_grace_s
        if grace <= 0:
            self.lose(reason)
            return False
        if self.chan is not None:
            self.chan.close()
            self.chan = None  # what the agent says meanwhile waits (send)
        deadline = self.last_heard + grace
        log.warning(
            "%s; keeping this host's ranks for up to %.0f s while reconnecting", reason, grace
        )
        self.rejoining = True
        self.on_controller_gone()
        delay = REJOIN_FIRST_S
        tries = 0
        try:
            while time.monotonic() < deadline:
                # The primary's address and the standby's in turn: whichever leads answers.
                to = self.standby if self.standby is not None and not tries % 2 else None
                tries += 1
                try:
                    await self.open(port=free_port(ALL_INTERFACES), rejoin=True, to=to)
                    log.warning("reconnected to the %s controller", "standby" if to else "primary")
                    return True
                except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
                    where = "the standby" if to else "the primary"
                    log.info("no controller yet at %s (%s)", where, e.__class__.__name__)
                except ProtocolError as e:
                    log.warning("the controller refused us: %s", e)
                await asyncio.sleep(max(0.0, min(delay, deadline - time.monotonic())))
                delay = min(2 * delay, REJOIN_CAP_S)
        finally:
            self.rejoining = False
        self.lose(f"{reason}, and no controller came back within {grace:g} s")
        return False

    async def heartbeat_loop(self, generation: Callable[[], int | None]) -> None:
        """Heartbeat every heartbeat_interval_s (with the generation running here). A remote
        agent that hears nothing from the controller for fence_timeout_s takes it for gone:
        it closes the connection, and the receive loop rejoins or fences. Returns once fenced."""
        check = StallGuard()
        warned = False
        while True:
            if self.chan is not None and not self.rejoining:
                self.chan.send("heartbeat", gen=generation())
            silent = time.monotonic() - self.last_heard
            if self.chan is not None and check.due() and silent > self.boot.fence_timeout_s:
                if not self.boot.local and self._only_slow(silent):
                    pass  # its machine acknowledges us: the controller is slow, not gone
                elif not self.boot.local:
                    why = f"no word from the controller for {silent:.1f} s"
                    if self.boot.controller_grace_s <= 0:
                        self.lose(why)
                        return
                    if not self.rejoining:
                        log.warning("%s: taking it for gone", why)
                        # What is said from now on waits for the next controller (send); the
                        # receive loop sees the closed connection and rejoins.
                        self.rejoining = True
                        self.chan.abort()
                elif not warned:
                    log.warning(
                        "no word from the controller for %.1f s; not fencing: it runs "
                        "on this host, and its exit would close our connection",
                        silent,
                    )
                    warned = True
            elif silent <= self.boot.fence_timeout_s:
                warned = False
                self._slow_said = False
            await check.sleep(self.boot.heartbeat_interval_s)

    def _only_slow(self, silent: float) -> bool:
        """Whether a silent controller is only slow: its machine's kernel still acknowledges
        our heartbeats (peer_kernel.py), so the process is starved or stopped, not lost with its
        machine or cut off from us. Then we wait, up to a bound that leaves half the grace for a
        takeover: a controller stuck for good must not leave the job unsupervised."""
        assert self.chan is not None
        bound = min(SLOW_CONTROLLER_LIMIT_S, self.boot.controller_grace_s / 2)
        if silent > bound or not peer_kernel.answers(self.chan.writer.get_extra_info("socket")):
            return False
        if not self._slow_said:
            log.warning(
                "no word from the controller for %.1f s, but its machine acknowledges what we "
                "send: it is slow or stopped, not gone; waiting for it (up to %.0f s)",
                silent,
                bound,
            )
            self._slow_said = True
        return True

    def lose(self, reason: str) -> None:
        """The controller is lost for good (not told to stop): fence, and remember why."""
        if self.lost is None:
            self.lost = reason
        self._fence(reason)

    def send(self, kind: str, **fields: Any) -> None:
        """Send a message; one too big for a frame (a bug: reports are bounded) is sent with
        every field cut short rather than lost, and said so. Before the hello, it waits for it;
        output waits in the ring (unacked.py), which the next connection sends again."""
        if kind in REPLAYED:
            fields = self.unacked.add(kind, fields)
        if self.chan is not None and not self.rejoining:
            self._send_now(kind, fields)
        elif kind in REPLAYED:
            pass  # kept in the ring: the next connection sends it
        elif len(self._early) < MAX_EARLY_MESSAGES:
            self._early.append((kind, fields))
        else:
            log.error("not connected; dropped a %s message", kind)

    def _send_now(self, kind: str, fields: dict[str, Any]) -> None:
        assert self.chan is not None
        try:
            self.chan.send(kind, **fields)
        except ProtocolError as e:
            log.error("%s message too big (%s); sending it cut short", kind, e)
            self.chan.send(kind, **shrunk(fields), shrunk=str(e))

    def unsent_bytes(self) -> int:
        """Bytes queued on the connection that the controller has not taken yet."""
        if self.chan is None or self.rejoining or self.chan.writer.transport is None:
            return 0
        try:
            return self.chan.writer.transport.get_write_buffer_size()
        except AttributeError:  # a TLS transport we closed (the controller went silent)
            return 0

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


def watch_stdin(
    loop: asyncio.AbstractEventLoop, *, on_eof: Callable[[], None], on_fence: Callable[[], None]
) -> threading.Thread:
    """Call on_fence (in the loop) when the launcher writes the word `fence` on our stdin (it
    terminates us on purpose), on_eof at EOF without it (the process that started us is gone:
    the controller, ssh or srun). Returns the watching thread, a daemon: it blocks in read()."""

    def wait_eof() -> None:
        # The raw fd, not sys.stdin: a daemon thread blocked inside a buffered reader makes
        # interpreter shutdown abort ("could not acquire lock ... at interpreter shutdown").
        seen = b""
        try:
            while chunk := os.read(0, 4096):
                seen = (seen + chunk)[-64:]
                if FENCE_WORD in seen:
                    loop.call_soon_threadsafe(on_fence)
                    return
        except OSError:
            pass
        loop.call_soon_threadsafe(on_eof)

    thread = threading.Thread(target=wait_eof, name="stdin-watch", daemon=True)
    thread.start()
    return thread
