"""The bounded metrics server (issue 34, item 2): what it serves, and what it refuses to hold:
no more than MAX_CONNECTIONS at once (a new one takes the place of the oldest, so a scraper gets
through a crowd of idle ones), none past its deadline, no request past its size."""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from ftrun.cli import metrics_server
from ftrun.cli.metrics_server import MAX_CONNECTIONS, BoundedServer
from tests.conftest import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import metrics_attacks


@pytest.fixture
def server() -> Iterator[BoundedServer]:
    srv = BoundedServer("127.0.0.1", 0, content_type="text/plain")
    srv.update(b"ftrun_step 7\n")
    srv.start()
    try:
        yield srv
    finally:
        srv.close()
    assert not any(t.name == "ftrun-metrics" for t in threading.enumerate())
    assert srv.listener.fileno() == -1


def ask(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def closed_by_server(sock: socket.socket, timeout_s: float) -> bool:
    sock.settimeout(timeout_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_it_serves_the_page_it_was_given(server: BoundedServer) -> None:
    assert metrics_attacks.scrape(server.port) == b"ftrun_step 7\n"
    server.update(b"ftrun_step 8\n")
    assert metrics_attacks.scrape(server.port) == b"ftrun_step 8\n"
    head = ask(server.port, b"HEAD /metrics HTTP/1.0\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and head.endswith(b"\r\n\r\n")
    assert ask(server.port, b"POST / HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405")
    assert ask(server.port, b"nonsense\r\n\r\n").startswith(b"HTTP/1.1 400")


def test_a_crowd_of_idle_connections_is_capped_and_a_scrape_gets_through(
    server: BoundedServer,
) -> None:
    me = psutil.Process()
    before = me.num_fds()
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(300)]
    try:
        for sock in idle:
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")  # and never the end of the request
        # The server's side of them: at most MAX_CONNECTIONS open (300 here are our ends).
        wait_for(lambda: me.num_fds() - before - len(idle) <= MAX_CONNECTIONS, 10, "the cap")
        assert metrics_attacks.scrape(server.port) == b"ftrun_step 7\n"
        closed = sum(closed_by_server(s, 0.01) for s in idle[:200])
        assert closed >= 200 - MAX_CONNECTIONS
    finally:
        for sock in idle:
            sock.close()
    assert server.dropped >= 300 - MAX_CONNECTIONS


def test_a_slow_or_oversized_request_is_closed(
    server: BoundedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics_server, "REQUEST_TIMEOUT_S", 0.5)
    slow = socket.create_connection(("127.0.0.1", server.port))
    big = socket.create_connection(("127.0.0.1", server.port))
    try:
        slow.sendall(b"GET / HTTP/1.1\r\n")
        assert closed_by_server(slow, 10)  # at its deadline, unanswered
        with pytest.raises(OSError):  # reset mid-send, or closed before the end
            for _ in range(64):
                big.sendall(b"X-Big: " + b"a" * 1024 + b"\r\n")
            assert closed_by_server(big, 10)
            raise OSError("closed")
    finally:
        slow.close()
        big.close()
