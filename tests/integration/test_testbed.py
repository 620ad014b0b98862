"""The ssh testbed (scripts/testbed.sh) with real sshd, real ssh and real TCP: hosts come up and
reach each other and the bridge, `kill` is a power loss, `cut`/`heal` a partition, `down` leaves
nothing. Each fault test restores what it broke, so the tests do not depend on their order (and
the session's testbed, which these tests share with others, is reset after each: conftest.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.conftest import Output, wait_for
from tests.testbed import SCRIPT, Testbed, unavailable_reason
from tests.testbed import using as processes_using

# In a parameter: the prefix of the session's testbed (known only once it is up).
SESSION_PREFIX = "<the session testbed's prefix>"


def tcp_connects(address: str, port: int = 22, timeout: float = 1.0) -> bool:
    try:
        socket.create_connection((address, port), timeout=timeout).close()
        return True
    except OSError:
        return False


def live(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_up_prints_the_addresses_and_writes_an_ssh_config(testbed: Testbed):
    net = testbed.subnet.removesuffix(".0/24")  # 10.213.47.0/24: node1 is .11, node2 .12, ...
    assert [h.address for h in testbed.hosts] == [
        f"{net}.{10 + k}" for k in range(1, testbed.n + 1)
    ]
    config = testbed.ssh_config.read_text()
    for h in testbed.hosts:
        assert f"Host {h.name}\n    HostName {h.address}\n" in config
    assert f'IdentityFile "{testbed.key}"' in config
    known = testbed.state_dir / "known_hosts"
    assert "StrictHostKeyChecking yes" in config and f'UserKnownHostsFile "{known}"' in config
    for h in testbed.hosts:  # each host's own key, under its alias and address
        key = (testbed.state_dir / h.name / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        assert f"{h.name},{h.address} {' '.join(key)}" in known.read_text().splitlines()
    status = testbed.script("status").stdout.splitlines()
    assert status == [
        f"{h.name} {h.address} link=up sshd=running processes=1" for h in testbed.hosts
    ]


def test_ssh_into_each_host_by_alias_and_by_address(testbed: Testbed):
    last = testbed.hosts[-1]
    for h, target in [*((h, h.name) for h in testbed.hosts), (last, last.address)]:
        r = subprocess.run(
            ["ssh", "-F", str(testbed.ssh_config), target, "hostname; hostname -I; whoami"],
            capture_output=True,
            text=True,
            timeout=15,
            stdin=subprocess.DEVNULL,
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [h.name, h.address, "root"]


def test_hosts_share_the_filesystem_and_the_python(testbed: Testbed, tmp_path: Path):
    (tmp_path / "shared.txt").write_text("written in the root namespace\n")
    probe = (
        "import socket, sys; n = socket.gethostname(); "
        "print(n, socket.gethostbyname(n), sys.executable)"
    )
    for h in testbed.hosts:
        r = testbed.ssh(h, f"cat '{tmp_path}/shared.txt' && '{sys.executable}' -c '{probe}'")
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0] == "written in the root namespace"
        # hostname-based rendezvous (torch's MASTER_ADDR from getfqdn) resolves inside the /24
        assert lines[1].split() == [h.name, h.address, sys.executable]


def test_hosts_reach_each_other_and_the_bridge(testbed: Testbed):
    with socket.create_server((testbed.bridge_address, 0)) as server:
        server.settimeout(10)
        port = server.getsockname()[1]
        for h in testbed.hosts:
            others = [o.address for o in testbed.hosts if o != h]
            script = " && ".join(f"timeout 3 bash -c 'echo > /dev/tcp/{a}/22'" for a in others)
            script += (
                f" && timeout 3 bash -c 'echo {h.name} > /dev/tcp/{testbed.bridge_address}/{port}'"
            )
            r = testbed.ssh(h, script)
            assert r.returncode == 0, r.stderr
            conn, (peer, _) = server.accept()
            with conn:
                conn.settimeout(5)
                assert conn.recv(100).decode().strip() == h.name
            assert peer == h.address  # it came over the bridge from the host's own address


def test_hosts_have_no_route_outside_the_subnet(testbed: Testbed):
    for h in testbed.hosts:
        r = testbed.ssh(h, "ip -4 route; echo --; ip -6 addr; echo --; ip -o link | wc -l")
        assert r.returncode == 0, r.stderr
        routes, v6, links = r.stdout.split("--\n")
        assert routes.split() == [
            testbed.subnet,
            "dev",
            "eth0",
            "proto",
            "kernel",
            "scope",
            "link",
            "src",
            h.address,
        ]
        assert v6.strip() == ""
        assert links.strip() == "2"  # lo and eth0


def test_fabric_connects_with_the_testbed_ssh_config(testbed: Testbed):
    fabric = pytest.importorskip("fabric")
    for h in testbed.hosts:
        config = fabric.Config(runtime_ssh_path=str(testbed.ssh_config))
        with fabric.Connection(h.name, config=config, connect_timeout=5) as conn:
            result = conn.run("hostname", hide=True, timeout=10, in_stream=False)
            assert (conn.user, conn.host, result.stdout.strip()) == ("root", h.address, h.name)


def test_kill_is_a_power_loss_and_start_powers_the_host_on(testbed: Testbed):
    victim, witness = testbed.hosts[2], testbed.hosts[0]
    started = testbed.ssh(victim, "setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $!")
    sleeper = int(started.stdout)
    session = subprocess.Popen(
        testbed.ssh_argv(
            victim,
            "echo ready; exec sleep 600",
            "-o",
            "LogLevel=INFO",
            "-o",
            "ServerAliveInterval=1",
            "-o",
            "ServerAliveCountMax=2",
        ),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    out = Output(session)
    try:
        out.wait_for("ready", 15)
        before = testbed.pids(victim)
        assert sleeper in before and len(before) >= 3  # sshd, the session, the sleeper

        testbed.kill(victim)

        assert testbed.pids(victim) == []
        assert not any(live(p) for p in before)
        # No FIN or RST got out: the client only learns from its keepalives, as on power loss.
        assert session.wait(timeout=15) == 255
        assert "not responding" in out.text()
        r = testbed.ssh(witness, f"timeout 1 bash -c 'echo > /dev/tcp/{victim.address}/22'")
        assert r.returncode != 0
        r = testbed.ssh(victim, "true", "-o", "ConnectTimeout=1")
        assert r.returncode == 255
    finally:
        if session.poll() is None:
            session.kill()
            session.wait(timeout=5)
        testbed.start(victim)

    assert testbed.ssh(victim, "hostname").stdout.strip() == victim.name
    assert (
        testbed.ssh(witness, f"timeout 3 bash -c 'echo > /dev/tcp/{victim.address}/22'").returncode
        == 0
    )


def test_cut_partitions_a_host_and_heal_restores_it(testbed: Testbed):
    victim, witness = testbed.hosts[1], testbed.hosts[0]
    echo = subprocess.Popen(
        testbed.ssh_argv(
            victim, 'while read l; do echo "got:$l"; done', "-o", "ServerAliveInterval=5"
        ),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    out = Output(echo)
    assert echo.stdin is not None
    try:
        echo.stdin.write("before\n")
        echo.stdin.flush()
        out.wait_for("got:before", 15)
        alive = testbed.pids(victim)

        testbed.cut(victim)
        try:
            assert (
                testbed.script("status")
                .stdout.splitlines()[1]
                .startswith(f"{victim.name} {victim.address} link=down sshd=running")
            )
            assert not tcp_connects(victim.address, timeout=1.0)
            r = testbed.ssh(witness, f"timeout 1 bash -c 'echo > /dev/tcp/{victim.address}/22'")
            assert r.returncode != 0
            assert all(live(p) for p in alive)  # a partition, not a crash
            echo.stdin.write("during\n")  # held in the client's TCP send queue
            echo.stdin.flush()
        finally:
            testbed.heal(victim)

        wait_for(lambda: tcp_connects(victim.address), 5, "the host to be reachable after heal")
        out.wait_for("got:during", 10)  # the existing connection recovered
        r = testbed.ssh(witness, f"timeout 3 bash -c 'echo > /dev/tcp/{victim.address}/22'")
        assert r.returncode == 0
    finally:
        echo.stdin.close()
        try:
            echo.wait(timeout=10)
        finally:
            if echo.poll() is None:
                echo.kill()
                echo.wait(timeout=5)


def namespaces() -> list[str]:
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def link_exists(name: str) -> bool:
    return (
        subprocess.run(["ip", "link", "show", name], capture_output=True, timeout=10).returncode
        == 0
    )


def test_up_is_idempotent_and_down_leaves_nothing(tmp_path: Path):
    if reason := unavailable_reason():
        pytest.skip(reason)
    forward = Path("/proc/sys/net/ipv4/ip_forward").read_text()
    bed = Testbed(2, state_dir=tmp_path / "odd dir", prefix="fttbd", subnet="10.213.49.0/24")
    try:
        first = bed.up()
        again = bed.up()  # tears down and comes up again
        assert first == again
        assert bed.ssh("node2", "hostname").stdout.strip() == "node2"
        sshds = processes_using(bed.state_dir)
        assert len(sshds) == 2
        assert Path("/proc/sys/net/ipv4/ip_forward").read_text() == forward
    finally:
        bed.down()

    assert not [ns for ns in namespaces() if ns.startswith("fttbd-")]
    assert not link_exists("fttbd-br") and not link_exists("fttbd-n1")
    assert not any(live(p.pid) for p in sshds)
    assert processes_using(bed.state_dir) == []
    assert not bed.state_dir.exists()
    assert Path("/proc/sys/net/ipv4/ip_forward").read_text() == forward
    bed.down()  # nothing up: still fine


def test_an_interrupted_up_leaves_nothing(tmp_path: Path):
    if reason := unavailable_reason():
        pytest.skip(reason)
    state = tmp_path / "state"
    env = {
        **os.environ,
        "FTRUN_TESTBED_DIR": str(state),
        "FTRUN_TESTBED_PREFIX": "fttbi",
        "FTRUN_TESTBED_SUBNET": "10.213.51.0/24",
    }
    proc = subprocess.Popen(
        ["bash", str(SCRIPT), "up", "3"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        # Interrupt half-way: hosts made, sshd configured, not yet known to be ready.
        wait_for(
            lambda: (state / "ssh_config").exists() or proc.poll() is not None,
            30,
            "up to write its ssh config",
        )
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
    if proc.returncode == 0:
        pytest.skip("up finished before it could be interrupted")  # too fast to catch: fine
    assert proc.returncode == 143 and "interrupted; tearing down" in err
    assert not [ns for ns in namespaces() if ns.startswith("fttbi-")]
    assert not link_exists("fttbi-br") and not state.exists()
    assert processes_using(state) == []


def run_script(
    *args: str, env: dict[str, str] | None = None, prefix: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*(prefix or []), "bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["kill", "node9"], {"FTRUN_TESTBED_PREFIX": SESSION_PREFIX}, "no testbed host 'node9'"),
        (["up", "0"], {}, "usage: testbed.sh up N"),
        (["up", "3", "4"], {}, "usage: testbed.sh up N"),
        (["up", "1"], {"FTRUN_TESTBED_SUBNET": "8.8.8.0/24"}, "is not private"),
        (["up", "1"], {"FTRUN_TESTBED_SUBNET": "10.213.47.5/24"}, "must look like"),
        (["up", "1"], {"FTRUN_TESTBED_PREFIX": "Bad-Prefix"}, "FTRUN_TESTBED_PREFIX"),
        (["frobnicate"], {}, "unknown command 'frobnicate'"),
    ],
)
def test_bad_input_is_one_clear_line(testbed: Testbed, tmp_path: Path, args, env, message):
    # Its own prefix and dir: a refused `up` must not be able to touch any testbed that is up.
    env = {k: testbed.prefix if v == SESSION_PREFIX else v for k, v in env.items()}
    r = run_script(
        *args,
        env={"FTRUN_TESTBED_DIR": str(tmp_path / "state"), "FTRUN_TESTBED_PREFIX": "fttbx", **env},
    )
    assert r.returncode != 0
    assert r.stderr.startswith("testbed.sh: error: ") and message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert r.stdout == ""


def test_a_subnet_in_use_is_refused_without_touching_it(testbed: Testbed, tmp_path: Path):
    r = run_script(
        "up",
        "1",
        env={
            "FTRUN_TESTBED_DIR": str(tmp_path / "other"),
            "FTRUN_TESTBED_PREFIX": "fttbc",
            "FTRUN_TESTBED_SUBNET": testbed.subnet,
        },
    )
    assert r.returncode != 0
    assert (
        r.stderr.strip()
        .splitlines()[-1]
        .startswith(f"testbed.sh: error: subnet {testbed.subnet} is already in use here")
    )
    assert not [ns for ns in namespaces() if ns.startswith("fttbc-")] and not link_exists(
        "fttbc-br"
    )
    assert testbed.ssh("node1", "true").returncode == 0


def test_not_root_is_refused(testbed: Testbed):
    r = run_script(
        "down",
        env={"FTRUN_TESTBED_DIR": str(testbed.state_dir)},
        prefix=["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"],
    )
    assert r.returncode != 0
    assert r.stderr.strip() == (
        "testbed.sh: error: must run as root (network namespaces need "
        "CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    )
    assert testbed.ssh("node1", "true").returncode == 0
