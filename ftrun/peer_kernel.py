"""Whether the machine at the other end of a TCP connection still answers, from our kernel's own
record of the connection (TCP_INFO), when the process there has gone quiet.

Silence alone cannot tell a machine that lost power (or was cut off) from a process that is only
slow: starved on a busy machine, stopped with ^Z, in a long pause. The difference matters when the
verdict is a takeover of the job. The peer's kernel tells them apart: it acknowledges every
segment we send as long as the machine runs and the network carries, whatever its process does,
and stops when the machine or the link is gone. Each end sends heartbeats every fraction of a
second, so an acknowledgement no older than ANSWER_WINDOW_S is evidence that the machine is there.

Linux only (TCP_INFO's layout, include/uapi/linux/tcp.h); elsewhere, or on a socket that cannot
say, the answer is None and the caller judges by silence alone, as before. Ground floor: imports
nothing of ftrun.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

# An acknowledgement this recent means the peer's machine is there (heartbeats go every 0.25 s).
ANSWER_WINDOW_S = 1.0

# struct tcp_info: 8 one-byte fields, then 32-bit ones: rto, ato, snd_mss, rcv_mss, unacked,
# sacked, lost, retrans, fackets, last_data_sent, last_ack_sent, last_data_recv, last_ack_recv.
_UNACKED_AT = 8 + 4 * 4
_LAST_ACK_RECV_AT = 8 + 4 * 12
_NEEDED = _LAST_ACK_RECV_AT + 4
_TCP_INFO = getattr(socket, "TCP_INFO", None)


def answers(sock: Any, window_s: float = ANSWER_WINDOW_S) -> bool | None:
    """True when the peer's kernel acknowledged what we sent within window_s (or nothing we sent
    waits for an acknowledgement); False when segments wait unacknowledged and the last
    acknowledgement is older; None when this kernel or socket cannot say."""
    if sock is None or _TCP_INFO is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _NEEDED)
    except (OSError, AttributeError, TypeError):
        return None
    if len(info) < _NEEDED:
        return None
    (unacked,) = struct.unpack_from("I", info, _UNACKED_AT)
    (last_ack_ms,) = struct.unpack_from("I", info, _LAST_ACK_RECV_AT)
    return unacked == 0 or last_ack_ms <= window_s * 1000
