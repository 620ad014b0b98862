"""The multi-host testbed for integration tests: N sshd hosts in network namespaces.

Owns starting and always tearing down `scripts/testbed.sh` (docs/testbed.md) from Python, so a
test gets real hosts to ssh into and faults to inject (power loss, partition) without knowing the
script's details. Needs root; `unavailable_reason()` says why not when it cannot run.

    def test_something(testbed: Testbed):      # the session's testbed (tests/conftest.py)
        node2 = testbed.hosts[1]
        assert testbed.ssh(node2, "hostname").stdout.strip() == "node2"
        testbed.cut(node2)                       # healed again after the test (`reset`)

Two testbeds can be up at once only with different `prefix` and `subnet` (and state dirs): each
pytest-xdist worker has its own (`worker_network`), so testbed tests run on every worker at once.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "testbed.sh"
# The environment may move the default testbed, so that a second suite (a worktree's) can run
# beside CI's: FTRUN_TESTBED_PREFIX=ftwt FTRUN_TESTBED_SUBNET=10.213.90.0/24 pytest ...
DEFAULT_SUBNET = os.environ.get("FTRUN_TESTBED_SUBNET", "10.213.47.0/24")
DEFAULT_PREFIX = os.environ.get("FTRUN_TESTBED_PREFIX", "fttb")


def worker_network(
    prefix: str = DEFAULT_PREFIX, subnet: str = DEFAULT_SUBNET, worker: str | None = None
) -> tuple[str, str]:
    """The prefix and subnet of this pytest-xdist worker's testbed: worker gw0 (or no worker) has
    the defaults, gwK has the prefix with K appended and the subnet's third number moved by
    100 * K, so that every worker's testbed can be up at once (10.213.47.0/24, 10.213.147.0/24).
    The subnets that tests bring up beds of their own on (10.213.48-64) are never a worker's."""
    if worker is None:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    k = int(worker.removeprefix("gw") or 0)
    if k == 0:
        return prefix, subnet
    a, b, c, rest = subnet.split(".", 3)
    return f"{prefix[: 8 - len(str(k))]}{k}", f"{a}.{b}.{(int(c) + 100 * k) % 256}.{rest}"


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

    # -- between tests and after `down` ------------------------------------------------------

    def status(self) -> dict[str, dict[str, str]]:
        """`testbed.sh status` by host: {"node1": {"link": "up", "sshd": "running", ...}}."""
        out = {}
        for line in self.script("status").stdout.splitlines():
            name, _address, *fields = line.split()
            out[name] = dict(f.split("=", 1) for f in fields)
        return out

    def live(self, host: Host | str | int) -> list[psutil.Process]:
        """The host's live processes (zombies aside)."""
        live = []
        for pid in self.pids(host):
            try:
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE:
                    live.append(proc)
            except psutil.Error:
                continue
        return live

    def only_sshd(self, host: Host | str | int) -> bool:
        """Nothing of a test left on the host: its one live process is its sshd listener."""
        live = self.live(host)
        try:
            return len(live) == 1 and live[0].name() == "sshd"
        except psutil.Error:
            return False

    def describe_left(self, hosts: list[Host] | None = None) -> str:
        """What runs on the hosts besides their sshd listener, for a failure message."""
        out = []
        for host in self.hosts if hosts is None else hosts:
            if self.only_sshd(host):
                continue
            for proc in self.live(host):
                try:
                    out.append(f"{host.name}: {proc.pid} {' '.join(proc.cmdline())[:150]}")
                except psutil.Error:
                    continue
        return "; ".join(out)

    def reset(self, timeout_s: float = 15.0) -> None:
        """Every host powered on and connected, and nothing on it but its sshd listener, as after
        `up`: what a test sharing the testbed leaves for the next one. A host that was powered
        off is started, a cut one healed; then it waits (`timeout_s`) for the processes the test
        left on a host to end. If some do not, it raises TestbedError naming them, after powering
        their hosts off and on again."""
        for name, state in self.status().items():
            if state.get("sshd") != "running":
                self.start(name)  # also brings its link up
            elif state.get("link") != "up":
                self.heal(name)
        deadline = time.monotonic() + timeout_s
        while not all(self.only_sshd(h) for h in self.hosts):
            if time.monotonic() >= deadline:
                left = self.describe_left()
                for host in self.hosts:  # power-cycled, so that the next test finds them clean
                    if not self.only_sshd(host):
                        self.kill(host)
                        self.start(host)
                raise TestbedError(f"left on the testbed {timeout_s} s after the test: {left}")
            time.sleep(0.1)  # poll interval

    def remains(self) -> list[str]:
        """What of this testbed exists (after `down`: nothing): namespaces, links, processes
        that name its state dir (sshd), the state dir."""
        listed = subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True, timeout=10
        ).stdout.split("\n")
        found = [f"namespace {ns.split()[0]}" for ns in listed if ns.startswith(f"{self.prefix}-")]
        links = subprocess.run(
            ["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=10
        ).stdout.splitlines()
        for line in links:
            name = line.split(": ")[1].split("@")[0] if ": " in line else ""
            if name == f"{self.prefix}-br" or name.startswith(f"{self.prefix}-n"):
                found.append(f"link {name}")
        found += [f"process {p.pid} {' '.join(p.cmdline())[:100]}" for p in using(self.state_dir)]
        if self.state_dir.exists():
            found.append(f"state dir {self.state_dir}")
        return found


def using(path: Path) -> list[psutil.Process]:
    """Live processes whose command line names `path` (sshd's does its config in its state dir)."""
    found = []
    for proc in psutil.process_iter():
        try:
            # sshd rewrites its title into one string, so join before looking for the path
            if proc.status() != psutil.STATUS_ZOMBIE and str(path) in " ".join(proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


class bring_up_lock:
    """One testbed (ssh or Slurm) brought up at a time on this machine, by any pytest worker: on
    a fresh machine `up` installs packages with apt-get, which two at once may not. A lock on
    this file (nothing left behind), waited for at most `timeout_s`."""

    def __init__(self, timeout_s: float = 900.0) -> None:
        self.timeout_s = timeout_s

    def __enter__(self) -> None:
        self._file = open(__file__)  # closed in __exit__
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    self._file.close()
                    raise TestbedError(
                        f"another testbed kept being brought up for {self.timeout_s} s"
                    ) from None
                time.sleep(0.1)  # poll interval

    def __exit__(self, *exc: object) -> None:
        self._file.close()  # releases the lock


def ssh_testbed_fixture(
    n: int = 3, *, scope: str = "session", name: str = "testbed", **options: Any
) -> Callable[..., Any]:
    """A pytest fixture `name` giving a Testbed of `n` hosts, torn down at the end of `scope`,
    and checked to leave nothing behind (`remains`).

    `options` go to Testbed (subnet, prefix, state_dir); without state_dir the state lives in a
    pytest temporary directory whose name has a space in it; without prefix and subnet, the
    worker's (`worker_network`). Skips when `unavailable_reason()`.
    """

    @pytest.fixture(scope=scope, name=name)  # type: ignore[call-overload]
    def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
        reason = unavailable_reason()
        if reason:
            pytest.skip(reason)
        kwargs = dict(options)
        kwargs.setdefault("state_dir", tmp_path_factory.mktemp("testbed") / "state dir")
        if "prefix" not in kwargs and "subnet" not in kwargs:
            kwargs["prefix"], kwargs["subnet"] = worker_network()
        bed = Testbed(n, **kwargs)
        try:
            with bring_up_lock():
                bed.up()
            yield bed
        finally:
            bed.down()  # always, even when `up` failed half-way
        left = bed.remains()
        assert not left, f"the testbed left behind after down: {left}"

    return testbed
