"""Small network helpers that both the controller and the agents need. Ground floor: imports
nothing of ftrun, so any layer can use them."""

from __future__ import annotations

import random
import socket

LOOPBACK = "127.0.0.1"
# The wildcard address: a port free here is free for every interface of the host, which is what
# a port that other hosts will dial (a generation's rendezvous) needs.
ALL_INTERFACES = ""


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on `host` now, below the kernel's ephemeral range when one is free there.

    Picked before it is needed, so a restart never waits on a port still in TIME_WAIT from the
    generation it replaces. Someone else may take it between this call and its use: callers pass
    it to a process that binds it soon after. A port the kernel hands out itself (bind to port
    0) is one of its ephemeral ports, which every outgoing connection on the machine also draws
    from: on a busy machine one of them took a rendezvous port in that gap, and torchrun failed
    with "The server socket has failed to listen" (seen in CI, a restart charged to the job).
    Below the range only an explicit bind can take it. `host` is the address the port must be
    free on: LOOPBACK for a port dialled only on this machine, ALL_INTERFACES for one other
    hosts dial.
    """
    low, _ = ephemeral_range()
    if low - PORT_FLOOR >= 1024:
        for port in random.sample(range(PORT_FLOOR, low), PORT_TRIES):
            if _bindable(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# Ports free_port picks from, below the ephemeral range: above the registered services most
# hosts run, and tried this many times before the kernel's own pick.
PORT_FLOOR = 20000
PORT_TRIES = 20


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The kernel's ephemeral ports (Linux's default when it cannot be read)."""
    try:
        with open(path) as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True
