"""The loop that keeps this host's newest memory snapshots in its peer's memory.

Each generation, the controller names each host's peer: the next host of the generation, in a
ring. While the generation runs, this loop looks at its ranks' memory tiers every POLL_S and
pushes each rank's newest snapshot that the peer does not have yet. It pushes only the newest:
when the ranks snapshot faster than the rate allows, the ones in between are skipped, never
queued, so the replica is at most one push behind and the copy never holds training up (the
rank's own memory snapshot does not wait for it). A push the peer refuses (a newer generation
has the host) ends the loop: this generation is a zombie's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from ftrun.checkpoint.errors import UnsafePathError
from ftrun.checkpoint.storage import Invalid
from ftrun.errors import ProtocolError
from ftrun.peercopy import files, wire
from ftrun.wire.messages import Role
from ftrun.wire.protocol import Channel, open_channel

log = logging.getLogger("ftrun.agent")

# How often the ranks' manifests are looked at (a stat each, unless one changed): the replica
# lags the rank by this plus the push, and a restore needs it at most a snapshot behind.
POLL_S = 0.02
CONNECT_TIMEOUT_S = 5.0
RETRY_CAP_S = 5.0


class Refused(Exception):
    """The peer refused our pushes: it knows a newer generation."""


class Replicator:
    def __init__(
        self,
        *,
        tier: Path,
        ranks: list[int],
        gen: int,
        host: str,
        peer: tuple[str, int],
        secret: str,
        rate: float,
        running: Callable[[], bool],
    ) -> None:
        self.tier, self.ranks, self.gen, self.host = tier, ranks, gen, host
        self.peer, self.secret = peer, secret
        self.pacer = wire.Pacer(rate)
        self.running = running
        self.sent: dict[int, tuple[int, int]] = {}  # rank → (step, generation) the peer has
        self.seen: dict[int, tuple[object, ...]] = {}  # rank → its manifests' stamps, last look
        self.pushed = 0
        self.bytes = 0
        self.delay = POLL_S  # before the next connection; doubles while it fails

    async def run(self) -> None:
        while self.running():
            try:
                chan = await self._connect()
            except (OSError, asyncio.TimeoutError) as e:
                log.info("peer %s:%s not reachable (%s); retrying", *self.peer, e)
                await asyncio.sleep(self.delay)
                self.delay = min(RETRY_CAP_S, self.delay * 2)
                continue
            try:
                await self._push_loop(chan)
            except Refused as e:
                log.warning("the peer refuses this generation's snapshots (%s): stopped", e)
                return
            except wire.SourceChanged:
                self.delay = POLL_S  # the rank moved on: its next snapshot, at once
            except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError) as e:
                log.info("peer connection lost (%s); reconnecting", e)
            except (ProtocolError, OSError, Invalid, UnsafePathError) as e:
                log.warning("peer copy failed (%s); reconnecting", e)
            finally:
                chan.close()
            # A peer that drops us (or refuses us before we read why) is not hammered.
            await asyncio.sleep(self.delay)
            self.delay = min(RETRY_CAP_S, self.delay * 2)

    async def _connect(self) -> Channel:
        chan = await open_channel(
            self.peer[0], self.peer[1], self.secret, CONNECT_TIMEOUT_S, server=Role.PEER
        )
        chan.send("hello", role="peer", host=self.host, gen=self.gen)
        return chan

    async def _push_loop(self, chan: Channel) -> None:
        refusal = asyncio.ensure_future(chan.receive())  # the store only speaks to refuse
        try:
            while self.running():
                for rank in self.ranks:
                    if refusal.done():
                        msg = refusal.result()  # raises what ended the connection
                        raise Refused(msg.get("message", msg["kind"]))
                    if await self.push_newest(chan, rank):
                        self.delay = POLL_S
                done, _ = await asyncio.wait({refusal}, timeout=POLL_S)
                if done:
                    msg = refusal.result()
                    raise Refused(msg.get("message", msg["kind"]))
        finally:
            refusal.cancel()

    async def push_newest(self, chan: Channel, rank: int) -> bool:
        """Push rank's newest snapshot unless the peer has it; True if one was pushed. What
        was looked at is remembered only once pushed: a push cut short is tried again."""
        directory = files.rank_dir(self.tier, rank)
        stamps = files.stamps(directory)
        if self.seen.get(rank) == stamps:
            return False  # no manifest changed: nothing new (the common case, every POLL_S)
        found = files.snapshots(directory, rank)
        if found and self.sent.get(rank) != found[0].key:
            self.bytes += await wire.send_snapshot(chan, directory, found[0], self.pacer)
            self.sent[rank] = found[0].key
            self.pushed += 1
        self.seen[rank] = stamps
        return bool(found)
