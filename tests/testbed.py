"""The multi-host testbed for integration tests: N sshd hosts in network namespaces.

Owns starting and always tearing down `scripts/testbed.sh` (docs/testbed.md) from Python, so a
test gets real hosts to ssh into and faults to inject (power loss, partition) without knowing the
script's details. Needs root; `unavailable_reason()` says why not when it cannot run.

    testbed = ssh_testbed_fixture(3)              # in a test module or conftest.py

    def test_something(testbed: Testbed):
        node2 = testbed.hosts[1]
        assert testbed.ssh(node2, "hostname").stdout.strip() == "node2"
        testbed.cut(node2)

Two testbeds can be up at once only with different `prefix` and `subnet` (and state dirs).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "testbed.sh"
# The environment may move the default testbed, so that a second suite (a worktree's) can run
# beside CI's: FTRUN_TESTBED_PREFIX=ftwt FTRUN_TESTBED_SUBNET=10.213.90.0/24 pytest ...
DEFAULT_SUBNET = os.environ.get("FTRUN_TESTBED_SUBNET", "10.213.47.0/24")
DEFAULT_PREFIX = os.environ.get("FTRUN_TESTBED_PREFIX", "fttb")


class TestbedError(RuntimeError):
    """A testbed.sh command failed; the message carries its stderr."""


@dataclass(frozen=True)
class Host:
    name: str  # ssh alias in the testbed's ssh_config and the hostname inside the host: "node2"
    address: str  # "10.213.47.12"
    namespace: str  # network namespace: "fttb-node2"


def unavailable_reason() -> str | None:
    """Why the testbed cannot run here, or None. Only root without network namespaces is refused."""
    if os.geteuid() != 0:
        return "the ssh testbed needs root (network namespaces)"
    probe = subprocess.run(
        ["unshare", "--net", "--mount", "true"], capture_output=True, text=True, timeout=10
    )
    if probe.returncode != 0:
        return f"network namespaces are not possible here: {probe.stderr.strip()}"
    return None


class Testbed:
    """`up` on enter, `down` on exit (always, even when `up` failed half-way)."""

    __test__ = False  # not a test class, whatever its name

    def __init__(
        self,
        n: int,
        *,
        state_dir: Path | None = None,
        subnet: str = DEFAULT_SUBNET,
        prefix: str = DEFAULT_PREFIX,
        up_timeout: float = 300.0,
        command_timeout: float = 30.0,
    ) -> None:
        self.n = n
        self.state_dir = Path(state_dir) if state_dir is not None else Path("/tmp/ftrun-testbed")
        self.subnet = subnet
        self.prefix = prefix
        self.up_timeout = up_timeout  # the first `up` on a fresh machine installs openssh-server
        self.command_timeout = command_timeout
        self.hosts: list[Host] = []
        self.env = {
            **os.environ,
            "FTRUN_TESTBED_DIR": str(self.state_dir),
            "FTRUN_TESTBED_SUBNET": subnet,
            "FTRUN_TESTBED_PREFIX": prefix,
        }

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Testbed:
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> list[Host]:
        out = self.script("up", str(self.n), timeout=self.up_timeout).stdout
        addresses = out.split()
        if len(addresses) != self.n:
            raise TestbedError(f"`testbed.sh up {self.n}` printed {addresses!r}")
        self.hosts = [
            Host(f"node{i}", a, f"{self.prefix}-node{i}") for i, a in enumerate(addresses, start=1)
        ]
        return self.hosts

    def down(self) -> None:
        self.hosts = []
        self.script("down")

    def script(
        self, *args: str, timeout: float | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Runs `scripts/testbed.sh ARGS` for this testbed; raises TestbedError on failure."""
        result = subprocess.run(
            ["bash", str(SCRIPT), *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout or self.command_timeout,
        )
        if check and result.returncode != 0:
            raise TestbedError(
                f"testbed.sh {' '.join(args)} exited {result.returncode}: "
                f"{result.stderr.strip()[-2000:]}"
            )
        return result

    # -- where things are --------------------------------------------------------------------

    @property
    def ssh_config(self) -> Path:
        return self.state_dir / "ssh_config"

    @property
    def key(self) -> Path:
        return self.state_dir / "id_ed25519"

    @property
    def bridge_address(self) -> str:
        """The root namespace's address on the testbed's bridge: where a controller listens."""
        return self.subnet.rsplit(".", 1)[0] + ".1"

    def host(self, which: Host | str | int) -> Host:
        """A host by Host, alias ("node2"), address, or 1-based index."""
        if isinstance(which, Host):
            return which
        for i, h in enumerate(self.hosts, start=1):
            if which in (h.name, h.address, h.namespace, i):
                return h
        raise KeyError(f"no testbed host {which!r} among {[h.name for h in self.hosts]}")

    # -- running commands on hosts -----------------------------------------------------------

    def ssh_argv(self, host: Host | str | int, command: str, *options: str) -> list[str]:
        """argv for `ssh` to the host with the testbed's config; `options` like "-o", "K=V"."""
        return ["ssh", "-F", str(self.ssh_config), *options, self.host(host).name, command]

    def ssh(
        self,
        host: Host | str | int,
        command: str,
        *options: str,
        timeout: float = 15.0,
        check: bool = False,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.ssh_argv(host, command, *options),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
        )

    def pids(self, host: Host | str | int) -> list[int]:
        """Live processes in the host's network namespace (zombies have left it)."""
        result = subprocess.run(
            ["ip", "netns", "pids", self.host(host).namespace],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if result.returncode != 0:
            raise TestbedError(
                f"ip netns pids {self.host(host).namespace}: {result.stderr.strip()}"
            )
        return [int(p) for p in result.stdout.split()]

    # -- faults ------------------------------------------------------------------------------

    def kill(self, host: Host | str | int) -> None:
        """Power loss: link down, then SIGKILL every process of the host."""
        self.script("kill", self.host(host).name)

    def start(self, host: Host | str | int) -> None:
        """Power on a killed host: link up, a fresh sshd; returns once it accepts ssh."""
        self.script("start", self.host(host).name)

    def cut(self, host: Host | str | int) -> None:
        """Partition: the host's link goes down; its processes keep running."""
        self.script("cut", self.host(host).name)

    def heal(self, host: Host | str | int) -> None:
        """The host's link comes up again; returns once both ends carry traffic."""
        self.script("heal", self.host(host).name)


def ssh_testbed_fixture(
    n: int = 3, *, scope: str = "session", **options: Any
) -> Callable[..., Any]:
    """A pytest fixture giving a Testbed of `n` hosts, torn down at the end of `scope`.

    `options` go to Testbed (subnet, prefix, state_dir); without state_dir the state lives in a
    pytest temporary directory whose name has a space in it. Skips when `unavailable_reason()`.
    """

    @pytest.fixture(scope=scope)  # type: ignore[call-overload]
    def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
        reason = unavailable_reason()
        if reason:
            pytest.skip(reason)
        kwargs = dict(options)
        kwargs.setdefault("state_dir", tmp_path_factory.mktemp("testbed") / "state dir")
        with Testbed(n, **kwargs) as bed:
            yield bed

    return testbed
