"""A bounded HTTP server for one pre-rendered page: the job's metrics (cli/metrics.py).

prometheus-client's own server is a ThreadingHTTPServer: a thread and a descriptor for every
connection, held as long as the peer likes (1,000 idle connections from another user left the
controller's process with 1,000 threads and descriptors, and the next rank log failed with
EMFILE). This one is what Prometheus exporters are meant to be: bounded, and served from a
snapshot. One thread, one selector, and
- at most MAX_CONNECTIONS connections open at once: a new one beyond that takes the place of
  the oldest (a scraper sends its request in a millisecond; what is oldest is what idles);
- every connection has REQUEST_TIMEOUT_S from its accept to send its request and read the
  answer, and a request is at most MAX_REQUEST_BYTES: then it is closed;
- the answer is bytes made before (`update`), not a computation per request.
It runs beside the controller's event loop, in its own thread, and never touches the journal.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

MAX_CONNECTIONS = 64
REQUEST_TIMEOUT_S = 5.0
MAX_REQUEST_BYTES = 8192
POLL_S = 0.2  # how often the loop looks at the stop flag and the deadlines
ACCEPTS_PER_ROUND = 256


@dataclass
class _Conn:
    sock: socket.socket
    deadline: float
    accepted: float
    request: bytearray = field(default_factory=bytearray)
    answer: memoryview | None = None  # being sent


class BoundedServer:
    def __init__(self, addr: str, port: int, *, content_type: str) -> None:
        infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, sockaddr = infos[0]
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.listener.bind(sockaddr)
            self.listener.listen(128)
            self.listener.setblocking(False)
        except OSError:
            self.listener.close()
            raise
        self.port: int = self.listener.getsockname()[1]
        self.content_type = content_type
        self._answer = self._response(200, b"", content_type)
        self._conns: dict[int, _Conn] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="ftrun-metrics", daemon=True)
        self.served = 0
        self.dropped = 0  # connections closed unanswered: evicted, too slow, too long

    def update(self, body: bytes) -> None:
        """What every request gets from now on."""
        self._answer = self._response(200, body, self.content_type)

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout_s)
        for conn in list(self._conns.values()):
            self._drop(conn, counted=False)
        self.listener.close()

    @staticmethod
    def _response(code: int, body: bytes, content_type: str) -> bytes:
        reason = {200: "OK", 400: "Bad Request", 405: "Method Not Allowed"}[code]
        head = (
            f"HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        return head.encode() + body

    def _serve(self) -> None:
        with selectors.DefaultSelector() as sel:
            self._sel = sel
            sel.register(self.listener, selectors.EVENT_READ)
            while not self._stop.is_set():
                for key, mask in sel.select(POLL_S):
                    if key.fileobj is self.listener:
                        self._accept()
                    elif (conn := self._conns.get(key.fd)) is not None:
                        self._step(conn, mask)
                now = time.monotonic()
                for conn in [c for c in self._conns.values() if c.deadline <= now]:
                    self._drop(conn)

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_ROUND):
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, a reset in the queue: the next round
                return
            if len(self._conns) >= MAX_CONNECTIONS:
                self._drop(min(self._conns.values(), key=lambda c: c.accepted))
            sock.setblocking(False)
            now = time.monotonic()
            conn = _Conn(sock, now + REQUEST_TIMEOUT_S, now)
            self._conns[sock.fileno()] = conn
            self._sel.register(sock, selectors.EVENT_READ)

    def _step(self, conn: _Conn, mask: int) -> None:
        try:
            if conn.answer is None and mask & selectors.EVENT_READ:
                data = conn.sock.recv(4096)
                if not data:
                    self._drop(conn)
                    return
                conn.request += data
                if b"\r\n\r\n" in conn.request or b"\n\n" in conn.request:
                    self._answer_request(conn)
                elif len(conn.request) > MAX_REQUEST_BYTES:
                    self._drop(conn)
                    return
            if conn.answer is not None and mask & selectors.EVENT_WRITE:
                sent = conn.sock.send(conn.answer)
                conn.answer = conn.answer[sent:]
                if not conn.answer:
                    self.served += 1
                    self._drop(conn, counted=False)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)

    def _answer_request(self, conn: _Conn) -> None:
        line = bytes(conn.request.split(b"\n", 1)[0]).split()
        if len(line) != 3 or not line[2].startswith(b"HTTP/"):
            answer = self._response(400, b"", "text/plain")
        elif line[0] == b"GET":
            answer = self._answer
        elif line[0] == b"HEAD":
            answer = self._answer[: self._answer.index(b"\r\n\r\n") + 4]
        else:
            answer = self._response(405, b"", "text/plain")
        conn.answer = memoryview(answer)
        self._sel.modify(conn.sock, selectors.EVENT_WRITE)

    def _drop(self, conn: _Conn, *, counted: bool = True) -> None:
        self._conns.pop(conn.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError, AttributeError):
            self._sel.unregister(conn.sock)
        conn.sock.close()
        self.dropped += counted
