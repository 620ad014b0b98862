"""The runtime library for ranks: report progress to the local agent.

`ftrun.step(n)` costs one non-blocking datagram (a few microseconds), never blocks, never raises
into training, and does nothing when the script runs outside ftrun (plain python or torchrun).
"""

from __future__ import annotations

import os
import socket

_UNSET = object()
_target: object = _UNSET  # (socket, path, generation, rank) once resolved, or None outside ftrun


def _resolve() -> object:
    path = os.environ.get("FTRUN_AGENT_SOCK")
    if not path:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setblocking(False)
    return (sock, path, int(os.environ.get("FTRUN_GENERATION", "0")),
            int(os.environ.get("RANK", "0")))


def step(n: int) -> None:
    """Report that this rank finished training step n (call it once per step)."""
    global _target
    try:
        if _target is _UNSET:
            _target = _resolve()
        if _target is None:
            return
        sock, path, gen, rank = _target  # type: ignore[misc]
        sock.sendto(b'{"e":"step","g":%d,"r":%d,"s":%d}' % (gen, rank, int(n)), path)
    except Exception:  # noqa: BLE001 - progress reporting must never break training
        pass
