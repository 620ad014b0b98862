"""A degraded link on a testbed host: its eth0 (the host's side of its veth, in its network
namespace) shaped to a rate, as a NIC that negotiated down to 100 Mbit/s is, while the other
hosts run at the veth's full speed. Shared by the link check's test and scripts/bench_straggler.py.

tc's netem (delay, loss) is not in every kernel (not in the dev VM's); tbf is, and a slow NIC
is the commoner bad host anyway. The shaping is always removed, even when the test fails."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

RATE = "100mbit"


def _tc(namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", namespace, "tc", "qdisc", *args],
        capture_output=True,
        text=True,
        timeout=10,
    )


@contextmanager
def slow_link(namespace: str, rate: str = RATE) -> Iterator[None]:
    """The host's eth0 sends at `rate` at most while the block runs."""
    added = _tc(namespace, "add", "dev", "eth0", "root", "tbf", "rate", rate,
                "burst", "32kbit", "latency", "100ms")  # fmt: skip
    assert added.returncode == 0, f"tc qdisc add in {namespace}: {added.stderr.strip()}"
    try:
        yield
    finally:
        removed = _tc(namespace, "del", "dev", "eth0", "root")
        assert removed.returncode == 0, f"tc qdisc del in {namespace}: {removed.stderr.strip()}"
