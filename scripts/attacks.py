"""Live attacks on a running job's control plane, shared by tests/hostile/live and
scripts/bench_hostile.py.

Each attack talks to the controller the way an attacker would: a stranger on the network (no
secret), or a holder of the job secret (another process of the same user that read
control.json) who tries to be someone it is not. Each returns an Outcome saying whether the
controller refused it, judged from the outside: the connection closed by the controller, or
the message named in the journal as refused, and no effect on the job. The caller checks that
the job went on and that nothing was written outside the job's directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftrun.wire import protocol

CLOSE_TIMEOUT_S = protocol.NONCE_SEND_TIMEOUT_S + 5.0  # the server's hello deadline, and margin


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    secret: str
    job_dir: Path
    agent_ids: tuple[str, ...]  # the agents connected now (their ids are not secret)

    @classmethod
    def of_job(cls, job_dir: Path) -> Target:
        control = json.loads((job_dir / "control.json").read_text())
        agents = tuple(
            e["agent"]
            for e in events(job_dir)
            if e["kind"] == "agent_connected" and e.get("agent") is not None
        )
        return cls(control["host"], int(control["port"]), control["secret"], job_dir, agents)


@dataclass(frozen=True)
class Outcome:
    attack: str
    refused: bool
    detail: str


def events(job_dir: Path) -> list[dict[str, Any]]:
    out = []
    for line in (job_dir / "events.jsonl").read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


async def _closed_by_peer(reader: asyncio.StreamReader, timeout_s: float) -> bool:
    """True once the peer closes (EOF or reset) within timeout_s; what it sends is drained."""
    deadline = time.monotonic() + timeout_s
    try:
        while (left := deadline - time.monotonic()) > 0:
            if not await asyncio.wait_for(reader.read(65536), left):
                return True
    except (asyncio.TimeoutError, TimeoutError):
        return False
    except (ConnectionError, OSError):
        return True
    return False


async def _connect(t: Target) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(asyncio.open_connection(t.host, t.port), 10)


async def _raw_channel(t: Target, secret: str) -> tuple[protocol.Channel, bytes, bytes]:
    """The client's side of the handshake done by hand, so an attack can also see raw frames."""
    reader, writer = await _connect(t)
    server_nonce = await asyncio.wait_for(reader.readexactly(protocol.NONCE_BYTES), 10)
    client_nonce = protocol.new_nonce()
    writer.write(client_nonce)
    chan = protocol.Channel(
        reader,
        writer,
        send_key=protocol.direction_key(secret, server_nonce, client_nonce, b"c2s"),
        recv_key=protocol.direction_key(secret, server_nonce, client_nonce, b"s2c"),
    )
    return chan, server_nonce, client_nonce


def _refused_in_journal(t: Target, since: float, needle: str) -> bool:
    return any(
        e["kind"] in ("message_refused", "connection_refused")
        and e.get("t", 0) >= since
        and needle in str(e.get("reason", ""))
        for e in events(t.job_dir)
    )


async def _until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return predicate()


# ---- strangers: no secret -----------------------------------------------------------------


async def flood(t: Target, connections: int = 600) -> Outcome:
    """Many silent connections at once, past the pre-auth cap: every one must be closed by the
    controller (the excess at once, the rest at the hello deadline)."""
    opened = await asyncio.gather(
        *(_connect(t) for _ in range(connections)), return_exceptions=True
    )
    streams = [s for s in opened if isinstance(s, tuple)]
    try:
        closed = await asyncio.gather(*(_closed_by_peer(r, CLOSE_TIMEOUT_S) for r, _ in streams))
    finally:
        for _, w in streams:
            w.close()
    held = closed.count(False)
    return Outcome(
        "unauthenticated flood",
        held == 0 and len(streams) > protocol_cap(),
        f"{len(streams)} connections, {held} still open after {CLOSE_TIMEOUT_S:g} s",
    )


def protocol_cap() -> int:
    from ftrun.controller.server import MAX_PREAUTH

    return MAX_PREAUTH


async def oversized_frame(t: Target) -> Outcome:
    """Before any hello, a frame that claims 1 MiB: refused from its length, never read."""
    reader, writer = await _connect(t)
    try:
        await reader.readexactly(protocol.NONCE_BYTES)
        writer.write(protocol.new_nonce() + struct.pack("!I", protocol.MAX_FRAME_BYTES))
        writer.write(b"\0" * 4096)  # the start of it; the controller must not wait for the rest
        closed = await _closed_by_peer(reader, 2.0)
    finally:
        writer.close()
    return Outcome("oversized pre-auth frame", closed, "closed at once" if closed else "held")


async def garbage(t: Target) -> Outcome:
    """Random bytes instead of a handshake."""
    reader, writer = await _connect(t)
    try:
        writer.write(os.urandom(256))
        closed = await _closed_by_peer(reader, CLOSE_TIMEOUT_S)
    finally:
        writer.close()
    return Outcome("garbage handshake", closed, "closed" if closed else "held")


async def wrong_secret(t: Target) -> Outcome:
    """A well-formed hello under a secret that is not the job's."""
    chan, _, _ = await _raw_channel(t, protocol.new_secret())
    try:
        chan.send("hello", agent_id=t.agent_ids[0], host="x", pid=1)
        closed = await _closed_by_peer(chan.reader, CLOSE_TIMEOUT_S)
    finally:
        chan.close()
    return Outcome("wrong secret", closed, "closed" if closed else "held")


# ---- secret holders who pose as someone else ------------------------------------------------


async def impersonate_agent(t: Target) -> Outcome:
    """With the secret: a hello as a live agent (a second copy), and as an agent never started."""
    results = []
    for agent_id in (t.agent_ids[0], "nobody#0"):
        chan, _, _ = await _raw_channel(t, t.secret)
        try:
            chan.send("hello", agent_id=agent_id, host="x", pid=1)
            chan.send("gen_exited", gen=1, exit_code=0)  # would end the job if it were taken
            results.append(await _closed_by_peer(chan.reader, CLOSE_TIMEOUT_S))
        finally:
            chan.close()
    return Outcome("impersonate an agent", all(results), f"closed: {results}")


async def forged_role(t: Target) -> Outcome:
    """With the secret, as a client: say what only agents or the controller itself may say —
    a rank's crash, a log line with a path in it, the controller's own stop."""
    since = time.time()
    chan, _, _ = await _raw_channel(t, t.secret)
    try:
        chan.send("hello", role="client")
        chan.send("rank_exited", gen=1, rank=0, exit_code=1, signal=None)
        chan.send("log", gen=1, rank="/../../escaped", lines=["pwned"])
        chan.send("stop_requested")
        chan.send("agent_lost", reason="forged")
        await chan.drain(5)
        kinds = ("rank_exited", "log", "stop_requested", "agent_lost")
        refused = await _until(
            lambda: all(_refused_in_journal(t, since, f"may not send {k!r}") for k in kinds), 10
        )
    finally:
        chan.close()
    escaped = [p for p in t.job_dir.parent.parent.rglob("escaped*")]
    return Outcome(
        "forged role (client says agent's words)",
        refused and not escaped,
        "4 refused, journaled" if refused else "not all refused",
    )


async def oversized_request(t: Target) -> Outcome:
    """With the secret: a chaos request whose action is 900 KiB (its reply would not fit)."""
    since = time.time()
    chan, _, _ = await _raw_channel(t, t.secret)
    try:
        chan.send("hello", role="client")
        chan.send("chaos", action="x" * (900 * 1024))
        await chan.drain(5)
        refused = await _until(lambda: _refused_in_journal(t, since, "chaos: field 'action'"), 10)
    finally:
        chan.close()
    return Outcome("oversized chaos request", refused, "refused" if refused else "taken")


async def replay_across_directions(t: Target) -> Outcome:
    """With the secret: take a frame the controller sent us and send it back to it (the same
    connection), and replay one of our frames on a second connection."""
    since = time.time()
    chan, _, _ = await _raw_channel(t, t.secret)
    try:
        chan.send("hello", role="client")
        chan.send("hosts", action="remove", host="no-such-host")
        header = await asyncio.wait_for(chan.reader.readexactly(4), 10)
        frame = header + await chan.reader.readexactly(struct.unpack("!I", header)[0])
        chan.writer.write(frame)  # the controller's own words, back at it
        await chan.drain(5)
        back = await _until(lambda: _refused_in_journal(t, since, "bad authentication tag"), 10)
    finally:
        chan.close()
    # Our own frame, replayed on another connection: its keys are not this one's.
    first, _, _ = await _raw_channel(t, t.secret)
    second, _, _ = await _raw_channel(t, t.secret)
    try:
        hello = protocol.encode(
            {"v": protocol.VERSION, "kind": "hello", "seq": 1, "role": "client"},
            first._send_key,
        )
        second.writer.write(hello)
        across = await _closed_by_peer(second.reader, CLOSE_TIMEOUT_S)
    finally:
        first.close()
        second.close()
    return Outcome(
        "replay across directions / connections",
        back and across,
        f"reflected frame refused: {back}; replayed on another connection closed: {across}",
    )


ATTACKS: list[Callable[[Target], Awaitable[Outcome]]] = [
    flood,
    oversized_frame,
    garbage,
    wrong_secret,
    impersonate_agent,
    forged_role,
    oversized_request,
    replay_across_directions,
]


async def run_all(t: Target) -> list[Outcome]:
    return [await attack(t) for attack in ATTACKS]


def written_outside(root: Path, inside: Path, since: float) -> int:
    """Bytes in files under `root` but not under `inside` changed since `since` (wall clock)."""
    total = 0
    for path in root.rglob("*"):
        try:
            if path.is_relative_to(inside) or not path.is_file() or path.is_symlink():
                continue
            st = path.stat()
        except OSError:
            continue
        if st.st_mtime >= since:
            total += st.st_size
    return total
