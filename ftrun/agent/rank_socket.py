"""The rank-datagram protocol: the unix datagram socket (FTRUN_AGENT_SOCK) on which the shims
and the ranks tell the agent what happens to them, one JSON object per datagram.

    {"e": KIND, "g": GENERATION, "r": RANK, ...}      r is -1 for torchrun itself
    started    pid, shim, t          a process started              rank_shim.py
    exited     pid, code, sig, t     a rank exited, and exactly how rank_shim.py
    step       s                     the rank finished step s       ftrun.step (runtime.py)
    section    name, timeout, begin  a pause on purpose begins/ends ftrun.section (runtime.py)
    finishing                        the rank's code has returned   as_main.py (warm start)
    ckpt       s, p                  checkpoint of s committed      ftrun.checkpoint (rank 0)
                                     (p: for a preemption notice)
    stall      v                     v s blocked on checkpoints     ftrun.checkpoint (rank 0)
    restored   s, tier, d            restored s from tier in d s    ftrun.checkpoint (rank 0)

Datagrams rather than a stream: a rank sends without connecting and never blocks (a full socket
drops that news rather than stall training), each message arrives whole, and a rank that dies
leaves no half-written message behind. The senders spell these names themselves (rank_shim.py
runs as a plain file and imports nothing of ftrun; runtime.py is imported inside training).

What an event means for the generation is genrun.py's; this module reads and decodes them, and
drops what cannot be decoded, so no datagram can stop the agent reading the next one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Callable
from typing import Any

log = logging.getLogger("ftrun.agent")

# Larger than any event the senders write (a few hundred bytes): a longer one is cut short by
# the kernel, fails to decode, and is dropped.
MAX_DATAGRAM_BYTES = 65536


class RankSocket:
    """Reads the datagrams on `path` in the event loop and hands each event to `on_event`.
    An event that is malformed (not JSON, or on_event finds a field missing or of the wrong
    type: KeyError, TypeError, ValueError) is dropped and logged; any other exception from
    on_event is a bug, passed to `report(what, error)`, and the next datagram is read."""

    def __init__(
        self,
        path: str,
        *,
        on_event: Callable[[dict[str, Any]], None],
        report: Callable[[str, BaseException], object],
    ) -> None:
        self.path = path
        self._on_event = on_event
        self._report = report
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._loop: asyncio.AbstractEventLoop | None = None

    def open(self, loop: asyncio.AbstractEventLoop) -> None:
        self._sock.bind(self.path)
        self._sock.setblocking(False)
        loop.add_reader(self._sock.fileno(), self._read)
        self._loop = loop

    def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._loop = None
        self._sock.close()

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(MAX_DATAGRAM_BYTES)
            except (BlockingIOError, InterruptedError):
                return
            try:
                self._on_event(decode(data))
            except (ValueError, TypeError, KeyError) as e:
                log.warning("dropped a malformed datagram from a rank: %s", e)
            except Exception as e:  # noqa: BLE001 - a bug handling it: said, the next one is read
                self._report("rank event handler", e)


def decode(data: bytes) -> dict[str, Any]:
    """One datagram's event; ValueError when it is not a JSON object."""
    event = json.loads(data)
    if not isinstance(event, dict):
        raise ValueError(f"not an object: {data[:80]!r}")
    return event
