"""Small network helpers that both the controller and the agents need. Ground floor: imports
nothing of ftrun, so any layer can use them."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"
# The wildcard address: a port free here is free for every interface of the host, which is what
# a port that other hosts will dial (a generation's rendezvous) needs.
ALL_INTERFACES = ""


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on `host` now, chosen by the kernel (bind to port 0, then release it).

    Picked before it is needed, so a restart never waits on a port still in TIME_WAIT from the
    generation it replaces. Someone else may take it between this call and its use: callers pass
    it to a process that binds it soon after. `host` is the address the port must be free on:
    LOOPBACK for a port dialled only on this machine, ALL_INTERFACES for one other hosts dial.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
