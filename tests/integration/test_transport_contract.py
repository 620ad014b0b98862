"""The transport contract (ftrun/transport/base.py), run against every transport, as torchft runs
one test against every process-group implementation: local, ssh on the namespace testbed, and
slurm (srun steps inside an allocation made with `salloc --no-shell`) on the Slurm testbed.

What the controller relies on, whatever the transport:
- the agent it starts dials back to `bind_address()` and says hello as the host it was given;
- `alive()` never says False while the agent runs (False would make a silent agent lost);
- an agent that dies is seen gone: `returncode` is set, `alive()` is not True;
- `terminate()` leaves nothing of the agent on its host, and is safe to call twice;
- a host that cannot be started on is an FtrunError naming the host, not a traceback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from ftrun.agent import procs
from ftrun.bootstrap import Bootstrap
from ftrun.controller.server import ControlServer
from ftrun.errors import FtrunError
from ftrun.transport.local import LocalTransport
from ftrun.transport.slurm import SrunTransport
from ftrun.transport.ssh import SshTransport
from ftrun.wire.inbound import Hello
from ftrun.wire.protocol import new_secret
from tests.conftest import sweep_stale_agent_dirs
from tests.slurmbed import SlurmBed
from tests.testbed import Testbed

HELLO_TIMEOUT_S = 30.0
GONE_TIMEOUT_S = 15.0


@dataclass
class Case:
    """One transport, a host it can start agents on, and how a test looks at that host."""

    transport: Any
    host: str
    unreachable: tuple[Any, Bootstrap]  # a transport and a bootstrap it cannot start
    kill: Callable[[int], None]  # SIGKILL a pid on the host
    leftovers: Callable[[str], list[str]]  # live processes on the host carrying a process tag


def _local_leftovers(tag: str) -> list[str]:
    """The agent's own sweep (procs.tagged_processes), zombies aside: a reaped-late child is gone."""
    found = []
    for proc in procs.tagged_processes(tag):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{proc.pid} {' '.join(proc.cmdline())[:100]}")
        except psutil.Error:
            continue
    return found


def boot_for(host: str, *, python: str = sys.executable, test_id: str = "") -> Bootstrap:
    return Bootstrap(
        controller_host="",
        controller_port=0,
        secret=new_secret(),
        job_id=f"contract-{uuid.uuid4().hex[:8]}",
        agent_id=f"{host}#0",
        host=host,
        heartbeat_interval_s=0.25,
        fence_timeout_s=3.0,
        warm_start=False,
        python=python,
        # PYTHONPATH as the launcher forwards it: over ssh the agent imports this checkout's
        # ftrun, not whatever the interpreter finds on its own.
        env={
            **({"FTRUN_TEST_ID": test_id} if test_id else {}),
            **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}),
        },
    )


@pytest.fixture(
    params=[
        "local",
        pytest.param("ssh", marks=pytest.mark.testbed),
        pytest.param("slurm", marks=pytest.mark.testbed),
    ]
)
def case(
    request: pytest.FixtureRequest,
    test_id: str,
    no_survivors: None,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Case]:
    try:
        yield from _case(request, test_id, monkeypatch)
    finally:
        # A SIGKILLed agent cannot remove its directory; the next agent on the host would (the
        # product's way), but the suite leaves nothing behind. Hosts share this filesystem.
        sweep_stale_agent_dirs()


def _case(
    request: pytest.FixtureRequest, test_id: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Case]:
    if request.param == "local":
        monkeypatch.setenv("FTRUN_TEST_ID", test_id)  # what no_survivors looks for
        yield Case(
            LocalTransport(),
            "localhost",
            (LocalTransport(python="/nonexistent/bin/python3"), boot_for("localhost")),
            kill=lambda pid: os.kill(pid, signal.SIGKILL),
            leftovers=_local_leftovers,
        )
        return
    if request.param == "slurm":
        yield from _slurm_case(request.getfixturevalue("slurm"), test_id, monkeypatch)
        return
    bed: Testbed = request.getfixturevalue("testbed")
    host = bed.hosts[0].name

    def leftovers(tag: str) -> list[str]:
        out = bed.ssh(host, f"grep -lz 'FTRUN_AGENT_ID={tag}' /proc/[0-9]*/environ || true")
        return [line for line in out.stdout.split() if line.startswith("/proc/")]

    transport = SshTransport(python=sys.executable, ssh_config=bed.ssh_config)
    yield Case(
        transport,
        host,
        (transport, boot_for("no-such-host.invalid")),
        kill=lambda pid: bed.ssh(host, f"kill -9 {pid}"),
        leftovers=leftovers,
    )


def _slurm_case(bed: SlurmBed, test_id: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Case]:
    """node2 of an allocation held by `salloc --no-shell`, as the batch step of `ftrun sbatch`
    holds one: srun starts steps in it. The nodes are processes of this machine."""
    granted = bed.run(["salloc", "--no-shell", "--nodes=1", "--nodelist=node2"], timeout=60)
    job_id = granted.stderr.split("Granted job allocation")[1].split()[0]
    for name, value in (*bed.env.items(), ("SLURM_JOB_ID", job_id), ("FTRUN_TEST_ID", test_id)):
        if name.startswith(("SLURM", "FTRUN")):
            monkeypatch.setenv(name, value)
    transport = SrunTransport(python=sys.executable)
    try:
        yield Case(
            transport,
            "node2",
            (transport, boot_for("node9")),
            kill=lambda pid: os.kill(pid, signal.SIGKILL),
            leftovers=_local_leftovers,
        )
    finally:
        bed.run(["scancel", job_id])


def run(coro: Awaitable[Any], timeout_s: float = 120.0) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout_s))  # type: ignore[arg-type]


async def start(
    case: Case, tmp_path: Path, test_id: str
) -> tuple[ControlServer, Any, dict[str, Any], Bootstrap]:
    """Start one agent through the transport and wait for its hello on a real control server."""
    boot = boot_for(case.host, test_id=test_id)
    server = ControlServer(
        boot.secret,
        expected_agents={boot.agent_id},
        heartbeat_interval_s=0.25,
        host_lost_timeout_s=30.0,
    )
    boot = dataclasses.replace(
        boot, controller_port=await server.start(case.transport.bind_address())
    )
    with open(tmp_path / "agent.log", "ab") as log:
        handle = await case.transport.start_agent(boot, log=log)
    try:
        agent_id, hello = await asyncio.wait_for(server.inbox.get(), HELLO_TIMEOUT_S)
    except BaseException:
        await handle.terminate(5.0)
        await server.close()
        raise
    assert agent_id == boot.agent_id and isinstance(hello, Hello)
    return server, handle, hello, boot


async def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


def test_agent_dials_back_says_hello_and_is_not_called_dead(
    case: Case, tmp_path: Path, test_id: str
) -> None:
    async def scenario() -> None:
        server, handle, hello, boot = await start(case, tmp_path, test_id)
        try:
            assert hello.host == case.host and hello.pid > 0
            assert handle.host == case.host
            assert handle.returncode is None and handle.alive() is not False
            assert case.leftovers(boot.process_tag), "the agent does not carry its process tag"
        finally:
            await handle.terminate(5.0)
            await server.close()

    run(scenario())


def test_terminate_leaves_nothing_on_the_host_and_can_be_repeated(
    case: Case, tmp_path: Path, test_id: str
) -> None:
    async def scenario() -> None:
        server, handle, _, boot = await start(case, tmp_path, test_id)
        try:
            await handle.terminate(5.0)
            assert handle.returncode is not None and handle.alive() is not True
            assert case.leftovers(boot.process_tag) == []
            await handle.terminate(5.0)  # idempotent: the controller may call it again
        finally:
            await server.close()

    run(scenario())


def test_an_agent_that_dies_is_seen_gone(case: Case, tmp_path: Path, test_id: str) -> None:
    async def scenario() -> None:
        server, handle, hello, boot = await start(case, tmp_path, test_id)
        try:
            case.kill(hello.pid)
            await wait_until(
                lambda: handle.returncode is not None,
                GONE_TIMEOUT_S,
                "the transport to see the agent gone",
            )
            assert handle.alive() is not True
        finally:
            await handle.terminate(5.0)
            await server.close()
        assert case.leftovers(boot.process_tag) == []

    run(scenario())


def test_a_host_it_cannot_start_on_is_an_ftrun_error(case: Case, tmp_path: Path) -> None:
    transport, boot = case.unreachable

    async def scenario() -> FtrunError:
        with pytest.raises(FtrunError) as caught:
            with open(tmp_path / "agent.log", "ab") as log:
                await transport.start_agent(boot, log=log)
        return caught.value

    error = run(scenario())
    assert boot.host in error.message and error.hint
