"""The peer store every agent runs: keeps the replicas its ring neighbour pushes, serves fetches.

A push is refused, and the connection closed, when it comes from an older generation than this
host knows of: the newest one its agent launched, or the one that claimed its memory tier
(claims.py). That is the peer-memory write of generation fencing (docs/fencing.md): a zombie
host that still trains after the job moved on cannot overwrite the replica the new generation
may restore from. A fetch is answered to any agent of the job (the job secret): it reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from pathlib import Path

from ftrun.checkpoint.errors import UnsafePathError
from ftrun.checkpoint.storage import Invalid
from ftrun.claims import read_claim
from ftrun.errors import ProtocolError
from ftrun.peercopy import files, wire
from ftrun.wire.messages import Role, validate
from ftrun.wire.protocol import Channel, accept_channel

log = logging.getLogger("ftrun.agent")

HELLO_TIMEOUT_S = 10.0
# Connections that have not said a valid hello yet, at most: a stranger on the network cannot
# hold more of the agent's descriptors than this (the controller has the same guard).
MAX_UNAUTHENTICATED = 32


class PeerStore:
    def __init__(
        self, *, tier: Path, secret: str, job_id: str, newest_gen: Callable[[], int]
    ) -> None:
        self.tier = tier
        self.secret = secret
        self.job_id = job_id
        self.newest_gen = newest_gen
        self.server: asyncio.Server | None = None
        self.locks: dict[int, asyncio.Lock] = {}  # rank → its replica directory's
        self.refused = 0
        self.unauthenticated = 0
        self.writers: set[asyncio.StreamWriter] = set()  # open connections, closed by close()
        self.pushers: dict[asyncio.StreamWriter, int] = {}  # a pushing connection → its gen
        self.closed = False

    async def start(self) -> int:
        """Listen on every interface (the controller tells the others our address); returns
        the port. One socket, so one port: `host=""` would bind IPv4 and IPv6 apart, each on
        a port of its own, and the port said could be the other family's."""
        self.server = await asyncio.start_server(self._serve, sock=_any_address_socket())
        return int(self.server.sockets[0].getsockname()[1])

    def close(self) -> None:
        """Stop listening and end every connection: nothing writes into the memory tier after
        this (the agent removes it next)."""
        self.closed = True
        if self.server is not None:
            self.server.close()
        for writer in list(self.writers):
            writer.close()

    def fence_older(self, gen: int) -> None:
        """This host launches generation `gen`: cut off pushes of older generations under way.
        A push from a host that died mid-way would otherwise hold its rank's replica (and so a
        spare's fetch of it) until the blob timeout."""
        for writer, pusher_gen in list(self.pushers.items()):
            if pusher_gen < gen:
                writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        chan: Channel | None = None
        if self.unauthenticated >= MAX_UNAUTHENTICATED or self.closed:
            writer.close()
            return
        self.unauthenticated += 1
        self.writers.add(writer)
        try:
            try:
                chan = await accept_channel(reader, writer, self.secret)
                hello = await asyncio.wait_for(chan.receive(), HELLO_TIMEOUT_S)
                hello = validate(Role.PEER, hello)
                if hello["kind"] != "hello":
                    raise ProtocolError(f"expected a hello, got {hello['kind']!r}")
            finally:
                self.unauthenticated -= 1
            chan.trust(Role.PEER)
            gen = int(hello["gen"])
            while True:
                msg = await chan.receive()
                if msg["kind"] == "snapshot":
                    if (why := self._stale(gen)) is not None:
                        self.refused += 1
                        log.warning("refused a replica from %s: %s", hello.get("host"), why)
                        chan.send("refused", message=why)
                        await chan.drain(wire.SEND_TIMEOUT_S)
                        return
                    self.pushers[writer] = gen
                    await self._keep(chan, msg, gen)
                elif msg["kind"] == "fetch":
                    count = await self._answer(
                        chan, msg["ranks"], msg["which"], cover=bool(msg.get("cover"))
                    )
                    chan.send("fetched", count=count)
                    await chan.drain(wire.SEND_TIMEOUT_S)
                else:
                    raise ProtocolError(f"a peer may not start with {msg['kind']!r}")
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError):
            pass  # the peer went away (its generation ended, its host died)
        except (ProtocolError, OSError, Invalid, UnsafePathError, wire.SourceChanged) as e:
            log.warning("peer connection dropped: %s", e)
        finally:
            self.writers.discard(writer)
            self.pushers.pop(writer, None)
            writer.close()

    def _stale(self, gen: int) -> str | None:
        if self.closed:
            return "the agent is leaving"
        newest = self.newest_gen()
        claim = read_claim(self.tier)
        if claim is not None and claim.job == self.job_id:
            newest = max(newest, claim.generation)
        if gen < newest:
            return f"generation {gen} is older than generation {newest} of this host"
        return None

    async def _keep(self, chan: Channel, header: dict, gen: int) -> None:
        rank = int(header["rank"])
        async with self.locks.setdefault(rank, asyncio.Lock()):
            await wire.receive_snapshot(
                chan, header, files.replica_dir(self.tier, rank), refusal=lambda: self._stale(gen)
            )

    async def _answer(self, chan: Channel, ranks: list[int], which: str, *, cover: bool) -> int:
        """Send the snapshots held of `ranks`, from their own directories ("primary": ranks of
        this host, which may write meanwhile) or from the replicas kept here: every rank's
        newest first, then the older ones, so a fetch cut short still has a step in common.
        With `cover` (a host joining a re-planned job, which keeps them on top of its own
        ranks' slots): the newest only, and only those that hold a tensor the ones before them
        do not (files.covering): in data parallel one rank's, whatever the ranks per host."""
        count = 0
        pacer = wire.Pacer(0)  # the job waits for a fetch: as fast as it goes
        for depth in range(1 if cover else files.KEPT):
            held = []
            for rank in ranks:
                directory, lock = self._directory(rank, which)
                async with lock if lock is not None else contextlib.nullcontext():
                    snaps = files.snapshots(directory, rank)
                if depth < len(snaps):
                    held.append(snaps[depth])
            for snap in files.covering(held) if cover else held:
                directory, lock = self._directory(snap.rank, which)
                async with lock if lock is not None else contextlib.nullcontext():
                    # A push may have replaced a replica's slot since it was listed; under the
                    # lock it cannot change while it is sent (a rank's own slot may: then
                    # send_snapshot raises SourceChanged).
                    if lock is not None and not files.unchanged(directory, snap):
                        continue
                    await wire.send_snapshot(chan, directory, snap, pacer, locked=lock is not None)
                    count += 1
        return count

    def _directory(self, rank: int, which: str) -> tuple[Path, asyncio.Lock | None]:
        """Where rank's snapshots are, and the lock a replica's writer holds (none for a rank's
        own directory: its rank writes there, and send_snapshot checks the manifest instead)."""
        if which == "replica":
            return files.replica_dir(self.tier, rank), self.locks.setdefault(rank, asyncio.Lock())
        return files.rank_dir(self.tier, rank), None


def _any_address_socket() -> socket.socket:
    """A listening TCP socket on every address: dual-stack IPv6 where there is IPv6 (it takes
    IPv4 connections too), else IPv4."""
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(("::", 0))
        except OSError:
            sock.close()
            raise
    except OSError:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("0.0.0.0", 0))
    sock.listen(64)
    sock.setblocking(False)
    return sock
