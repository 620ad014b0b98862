"""peer_kernel.answers: whether the peer's machine acknowledges what we send (TCP_INFO)."""

from __future__ import annotations

import socket
import struct

from ftrun import peer_kernel


def tcp_info(unacked: int, last_ack_recv_ms: int) -> bytes:
    """A struct tcp_info as Linux lays it out: 8 bytes, then 32-bit fields in order."""
    fields = [0] * 13
    fields[4], fields[12] = unacked, last_ack_recv_ms
    return bytes(8) + struct.pack("13I", *fields)


class Recorded:
    """A socket whose TCP_INFO is given: the one seam the kernel does not let a test set."""

    def __init__(self, info: bytes) -> None:
        self.info = info

    def getsockopt(self, level: int, name: int, size: int) -> bytes:
        assert (level, name) == (socket.IPPROTO_TCP, socket.TCP_INFO)
        return self.info[:size]


def test_a_live_loopback_peer_answers() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    try:
        client = socket.create_connection(server.getsockname(), timeout=5)
        peer, _ = server.accept()
        with client, peer:
            client.sendall(b"heartbeat")  # the peer process never reads it: its kernel acks
            assert peer_kernel.answers(client) is True
    finally:
        server.close()


def test_segments_waiting_past_the_window_mean_the_machine_is_gone() -> None:
    assert peer_kernel.answers(Recorded(tcp_info(unacked=3, last_ack_recv_ms=2500))) is False
    assert peer_kernel.answers(Recorded(tcp_info(unacked=3, last_ack_recv_ms=400))) is True
    assert peer_kernel.answers(Recorded(tcp_info(unacked=0, last_ack_recv_ms=9000))) is True


def test_a_socket_that_cannot_say_gives_no_evidence() -> None:
    assert peer_kernel.answers(None) is None
    assert peer_kernel.answers(Recorded(b"\0" * 20)) is None
    assert peer_kernel.answers(object()) is None
