"""The SSH transport: one agent per host, each in its own ssh session opened with Fabric.

Fabric resolves what users expect from ssh: `~/.ssh/config` (or `--ssh-config`), User, Port,
IdentityFile, ProxyJump, the ssh-agent and default keys. We then keep the session's channel
open for the agent's whole life instead of running a command to completion:

- the Bootstrap (with the job secret) is written to the agent's stdin, never on a command line;
- the agent's stdin stays open: when the controller dies, its TCP connection to sshd closes, sshd
  closes the agent's stdin, and the agent keeps its ranks for its grace while it waits for a
  controller (`ftrun resume`) to come back, then fences: the remote agent owns its children
  and must kill them itself. To terminate it on purpose we write `fence` first;
- the agent's stdout/stderr come back over the same channel into `<job>/agents/<host>.log`.

Each host is opened in a worker thread (paramiko blocks), so all hosts start in parallel.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import shlex
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import IO, Any, TypeVar

from ftrun.bootstrap import FENCE_WORD, Bootstrap
from ftrun.errors import HostUnreachable
from ftrun.hostlist import split_target
from ftrun.transport import hostkeys
from ftrun.transport.escalate import escalate

log = logging.getLogger("ftrun.transport")
T = TypeVar("T")

DEFAULT_CONNECT_TIMEOUT_S = 10
START_TIMEOUT_S = 30.0  # connect + authenticate, then start the agent: each bounded by this
SWEEP_TIMEOUT_S = 10.0


def unreachable(host: str, error: str) -> HostUnreachable:
    """ssh to a host failed at start: the message carries ssh's own error."""
    return HostUnreachable(
        host, error, via="over ssh", hint=f"check that `ssh {host} true` works from this machine"
    )


class SshAgent:
    def __init__(
        self,
        host: str,
        process_tag: str,
        python: str,
        conn: Any,
        chan: Any,
        log_file: IO[bytes],
        *,
        env_prefix: str = "",
        term: int = 1,
    ) -> None:
        self.host = host
        self.term = term  # the sweep is refused where a newer controller leads (terms.py)
        self.process_tag = process_tag
        self.python = python
        self.env_prefix = env_prefix
        self.conn = conn
        self.chan = chan
        self.log_file = log_file
        self.ended = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(chan.fileno(), self._pump)

    @property
    def returncode(self) -> int | None:
        if self.chan.exit_status_ready():
            return int(self.chan.exit_status)
        return -1 if self.chan.closed else None

    def alive(self) -> bool | None:
        # A live ssh session says nothing about the host behind it (a partition keeps it open
        # for minutes): silence decides.
        return None

    def _pump(self) -> None:
        """The channel has output, or it ended: copy output to the host's agent log."""
        while self.chan.recv_ready():
            data = self.chan.recv(65536)
            if not data:
                break
            self.log_file.write(data)
        self.log_file.flush()
        if (self.chan.eof_received or self.chan.closed) and not self.chan.recv_ready():
            self._loop.remove_reader(self.chan.fileno())
            self.ended.set()

    async def terminate(self, timeout_s: float) -> None:
        # The agent was told to shut down. If it does not, `fence` and EOF on its stdin make it
        # fence itself; if even that fails, a fresh ssh session kills everything tagged with it.
        if not await escalate(self.ended.wait, [None, self._fence_in_thread], timeout_s):
            try:
                await asyncio.wait_for(in_thread(self._sweep), SWEEP_TIMEOUT_S)
            except (asyncio.TimeoutError, OSError, EOFError, Exception) as e:  # noqa: BLE001
                # Unreachable (partitioned, powered off): the agent fences itself, on its own.
                log.warning("%s: could not sweep the agent's processes: %s", self.host, e)
        if not self.ended.is_set():
            self._loop.remove_reader(self.chan.fileno())
        # Closing may block like any paramiko send; closing the transport unblocks the rest.
        try:
            await asyncio.wait_for(in_thread(self._close), timeout_s / 2)
        except asyncio.TimeoutError:
            log.warning("%s: the ssh connection did not close in time", self.host)
        self.log_file.close()

    def _fence_in_thread(self) -> Awaitable[None] | None:
        # paramiko may block on a full send window or a key exchange: off the loop
        return None if self.chan.closed else in_thread(self._fence_stdin)

    def _fence_stdin(self) -> None:
        self.chan.sendall(FENCE_WORD + b"\n")
        self.chan.shutdown_write()

    def _sweep(self) -> None:
        """Kill everything tagged with this agent's id, over a fresh session (bounded waits)."""
        chan = self.conn.transport.open_session(timeout=SWEEP_TIMEOUT_S / 2)
        try:
            chan.set_combine_stderr(True)
            chan.exec_command(
                f"exec env {self.env_prefix}{shlex.quote(self.python)} "
                f"-m ftrun.agent.procs {shlex.quote(self.process_tag)} {self.term}"
            )
            if not chan.status_event.wait(SWEEP_TIMEOUT_S / 2):
                raise TimeoutError("the sweep did not finish")
            if chan.recv_exit_status() != 0:
                output = chan.recv(4096).decode("utf-8", "replace").strip()
                raise RuntimeError(f"exit {chan.recv_exit_status()}: {output[-500:]}")
        finally:
            chan.close()

    def _close(self) -> None:
        self.chan.close()
        self.conn.close()


class SshTransport:
    def __init__(
        self,
        *,
        python: str,
        ssh_config: str | None = None,
        controller_addr: str | None = None,
        check_host_keys: bool = True,
    ) -> None:
        self.python = python
        self.ssh_config = ssh_config
        self.controller_addr = controller_addr
        # False only with --insecure-skip-host-key-check (see transport/hostkeys.py).
        self.check_host_keys = check_host_keys

    def bind_address(self) -> str:
        # Agents dial the address their host routes to us by, which we learn per host only
        # once connected (or --controller-addr, which may be a NAT address we cannot bind):
        # listen on every interface (every message is authenticated anyway).
        return "0.0.0.0"

    async def start_agent(self, boot: Bootstrap, *, log: IO[bytes]) -> SshAgent:
        try:
            conn, local_addr = await asyncio.wait_for(
                in_thread(self._connect, boot.host), START_TIMEOUT_S
            )
        except asyncio.TimeoutError:
            raise unreachable(boot.host, f"no ssh session within {START_TIMEOUT_S:g} s") from None
        dial = self.controller_addr or local_addr
        if dial is None:
            conn.close()
            raise unreachable(
                boot.host,
                "it is reached through a proxy (ProxyJump or "
                "ProxyCommand), so ftrun cannot tell which address it should "
                "dial back; pass --controller-addr",
            )
        boot = dataclasses.replace(boot, controller_host=dial)
        env_prefix = _env_prefix(boot)
        log_file = open(os.dup(log.fileno()), "ab")  # ours for the agent's life
        try:
            chan = await asyncio.wait_for(
                in_thread(self._exec, conn, boot, env_prefix), START_TIMEOUT_S
            )
        except BaseException as e:
            log_file.close()
            conn.close()  # also unblocks a thread still waiting inside paramiko
            if isinstance(e, asyncio.TimeoutError):
                raise unreachable(
                    boot.host, f"the agent did not start within {START_TIMEOUT_S:g} s of logging in"
                ) from None
            raise
        return SshAgent(
            boot.host,
            boot.process_tag,
            boot.python,
            conn,
            chan,
            log_file,
            env_prefix=env_prefix,
            term=boot.term,
        )

    def _connect(self, host: str) -> tuple[Any, str | None]:
        import fabric  # only the ssh transport needs fabric and paramiko: import on first use
        import paramiko

        target = split_target(host)
        try:
            config = fabric.Config(
                runtime_ssh_path=self.ssh_config,
                overrides={"timeouts": {"connect": DEFAULT_CONNECT_TIMEOUT_S}},
            )
        except Exception as e:  # noqa: BLE001 - paramiko's ConfigParseError and friends
            raise unreachable(host, f"cannot read the ssh config: {e}") from None
        conn = fabric.Connection(
            target.host,
            user=target.user,
            port=target.port,
            config=config,
            connect_kwargs={
                "banner_timeout": DEFAULT_CONNECT_TIMEOUT_S,
                "auth_timeout": DEFAULT_CONNECT_TIMEOUT_S,
            },
        )
        policies = self._arm(host, conn)
        try:
            conn.open()
        except hostkeys.HostKeyError:
            conn.close()
            raise
        except paramiko.BadHostKeyException as e:
            conn.close()
            policy = policies.get(e.hostname, policies[target.host])
            raise hostkeys.bad_key_error(policy, e) from None
        except (OSError, EOFError, paramiko.SSHException) as e:
            conn.close()
            raise unreachable(host, _describe(e)) from None
        sock = conn.transport.sock
        # Through a proxy the "socket" is an ssh channel: no address of ours the host can dial.
        local_addr = sock.getsockname()[0] if isinstance(sock, socket.socket) else None
        return conn, local_addr

    def _arm(self, host: str, conn: Any) -> dict[str, hostkeys.HostKeyPolicy]:
        """Host-key checking on the connection and on every ProxyJump hop before it (fabric
        builds those itself, each accepting any key). The policies by the host name paramiko
        reports (the target's also under the name the user gave)."""
        policies: dict[str, hostkeys.HostKeyPolicy] = {}
        hop: Any = conn
        while hop is not None and hasattr(hop, "client"):
            policy = hostkeys.resolve(
                host if hop is conn else hop.original_host,
                hop.ssh_config,
                hostname=hop.host,
                port=hop.port,
                user=hop.user,
                check=self.check_host_keys,
            )
            hostkeys.install(hop.client, policy, hostname=hop.host, port=hop.port)
            if hop is conn:
                policies[split_target(host).host] = policy
            policies.setdefault(hop.host, policy)
            hop = hop.gateway
        return policies

    def _exec(self, conn: Any, boot: Bootstrap, env_prefix: str) -> Any:
        import paramiko

        command = (
            f"cd / && exec env {env_prefix}FTRUN_AGENT_ID={shlex.quote(boot.process_tag)} "
            f"{shlex.quote(boot.python)} -m ftrun.agent"
        )
        try:
            chan = conn.transport.open_session(timeout=START_TIMEOUT_S)
            chan.set_combine_stderr(True)
            chan.exec_command(command)
            chan.sendall(json.dumps(dataclasses.asdict(boot)).encode() + b"\n")
        except (OSError, EOFError, paramiko.SSHException) as e:
            raise unreachable(boot.host, f"could not start the agent: {_describe(e)}") from None
        return chan


def _env_prefix(boot: Bootstrap) -> str:
    """The agent must import ftrun before it reads the bootstrap: a PYTHONPATH that makes it
    importable here goes on the command line (not secret; same paths on every host)."""
    pythonpath = boot.env.get("PYTHONPATH")
    return f"PYTHONPATH={shlex.quote(pythonpath)} " if pythonpath else ""


def in_thread(fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """Run a blocking ssh call in a daemon thread: paramiko blocks, and a call stuck on a dead
    host must never hold up the controller's exit (executor threads would)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def work() -> None:
        error: BaseException | None
        try:
            result = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
            result, error = None, e
        else:
            error = None
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:
            pass  # the loop is closed: nobody waits for this any more

    threading.Thread(
        target=work, name=f"ssh-{getattr(fn, '__name__', 'call')}", daemon=True
    ).start()
    return future


def _describe(e: BaseException) -> str:
    text = str(e) or e.__class__.__name__
    if isinstance(e, socket.timeout) or isinstance(e, TimeoutError):
        return f"connection timed out ({text})"
    return text
