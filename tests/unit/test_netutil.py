"""free_port (ftrun/netutil.py): a port free now, below the kernel's ephemeral range, where no
outgoing connection of the machine can take it before torchrun binds it."""

from __future__ import annotations

import socket
from pathlib import Path

from ftrun import netutil


def test_the_port_is_free_and_below_the_ephemeral_range() -> None:
    low, _ = netutil.ephemeral_range()
    for host in (netutil.LOOPBACK, netutil.ALL_INTERFACES):
        port = netutil.free_port(host)
        assert netutil.PORT_FLOOR <= port < low
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, port))  # free: it binds


def test_a_taken_port_is_never_given(monkeypatch) -> None:
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind((netutil.LOOPBACK, 0))
    held.listen()
    try:
        taken = held.getsockname()[1]
        # Only the taken port to try, then the kernel's own pick.
        monkeypatch.setattr(netutil, "ephemeral_range", lambda: (taken + 1, 60999))
        monkeypatch.setattr(netutil, "PORT_FLOOR", taken - 1000 if taken > 2024 else 1024)
        monkeypatch.setattr(netutil.random, "sample", lambda population, k: [taken] * k)
        assert netutil.free_port() != taken
    finally:
        held.close()


def test_an_unreadable_range_is_linuxs_default(tmp_path: Path) -> None:
    assert netutil.ephemeral_range(str(tmp_path / "missing")) == (32768, 60999)
    odd = tmp_path / "range"
    odd.write_text("not numbers\n")
    assert netutil.ephemeral_range(str(odd)) == (32768, 60999)
