"""The controller's listening socket, accepted by hand rather than by asyncio.start_server.

Two things asyncio's own accept loop gets wrong for a server strangers can reach:
- running out of descriptors: CPython 3.11 answers EMFILE by calling the loop's exception
  handler, removing the reader and scheduling a restart, and then goes on trying accept() up to
  `backlog` (4096) times in the same tick, so one exhausted second becomes thousands of
  journaled failures and thousands of restarts. Here EMFILE/ENFILE/ENOBUFS/ENOMEM pause
  accepting once, for ACCEPT_RETRY_S, and are reported once per pause;
- refusing a flood: the server decides at accept time, before any task, buffer or TLS
  handshake is spent on a connection; a refused one is closed at once, freeing its descriptor.

The listen queue stays deep (4096): thousands of agents connect at once when a big job starts.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
from collections.abc import Callable
from typing import Any

BACKLOG = 4096
ACCEPT_BATCH = 256  # connections taken per wake-up, so accepting never starves the loop
ACCEPT_RETRY_S = 1.0
OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
# A stream buffers up to twice this before it stops reading from the socket (asyncio's rule):
# what a peer that sends more than we read can make us hold. Frames bigger than this are still
# read whole: readexactly resumes reading as it waits.
STREAM_BUFFER_LIMIT = 32 * 1024


class Listener:
    """Calls `accepted(sock, peer)` for each connection (the caller admits or closes it, and
    turns it into streams with `streams`), and `exhausted(error)` once per pause for lack of
    descriptors or memory."""

    def __init__(
        self,
        *,
        accepted: Callable[[socket.socket, Any], None],
        exhausted: Callable[[OSError], None],
        tls: ssl.SSLContext | None = None,
        handshake_timeout_s: float = 5.0,
    ) -> None:
        self.accepted = accepted
        self.exhausted = exhausted
        self.tls = tls
        self.handshake_timeout_s = handshake_timeout_s
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._retry: asyncio.TimerHandle | None = None

    def start(self, host: str, port: int) -> int:
        self._loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
        sock.setblocking(False)
        self._sock = sock
        self._loop.add_reader(sock.fileno(), self._accept)
        return int(sock.getsockname()[1])

    def _accept(self) -> None:
        assert self._sock is not None and self._loop is not None
        for _ in range(ACCEPT_BATCH):
            try:
                conn, peer = self._sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as e:
                if e.errno not in OUT_OF_RESOURCES:
                    raise
                # Linux keeps the socket readable: stop listening for a while, say so once.
                self._loop.remove_reader(self._sock.fileno())
                self._retry = self._loop.call_later(ACCEPT_RETRY_S, self._resume)
                self.exhausted(e)
                return
            conn.setblocking(False)
            self.accepted(conn, peer)

    def _resume(self) -> None:
        self._retry = None
        if self._sock is not None and self._loop is not None:
            self._loop.add_reader(self._sock.fileno(), self._accept)

    async def streams(
        self, conn: socket.socket
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """An accepted socket as streams (TLS first, within the handshake deadline). Raises
        OSError (ssl.SSLError is one), TimeoutError or ConnectionError, the socket closed."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=STREAM_BUFFER_LIMIT)
        protocol = asyncio.StreamReaderProtocol(reader)
        try:
            transport, _ = await loop.connect_accepted_socket(
                lambda: protocol,
                conn,
                ssl=self.tls,
                ssl_handshake_timeout=self.handshake_timeout_s if self.tls else None,
            )
        except BaseException:
            conn.close()
            raise
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop)

    def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._sock is not None and self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
