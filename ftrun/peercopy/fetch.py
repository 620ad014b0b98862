"""What an agent does before it starts ranks whose snapshots are on another host.

The controller's launch says, for a host that takes over node rank i from another host (a spare
for a lost one), where rank i's snapshots are: the old host's own memory tier if it is still up
("primary"), and the replica its ring neighbour kept ("replica"), tried in that order until one
yields snapshots. Each lands in the slot files.slot_for picks: a snapshot this host already holds
that is newer is kept. The agent fetches them into
its own memory tier under the ranks' names, before the ranks start: then they restore from
memory like survivors, and ftrun.checkpoint needs to know nothing of peers. A host that joins a
re-planned job (a grow) runs ranks no host ran before: it fetches from one old node's memory the
newest snapshots of its ranks that together hold every tensor (one, in data parallel), and keeps
them as replicas, from which its ranks reshard (peer_plan.py). A fetch that fails or takes longer than FETCH_TIMEOUT_S leaves the tier without
them: the ranks restore from storage, as they would have without a peer copy, and the journal
says why.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from ftrun.checkpoint.errors import UnsafePathError
from ftrun.checkpoint.storage import Invalid
from ftrun.errors import ProtocolError
from ftrun.peercopy import files, wire
from ftrun.wire.messages import Role
from ftrun.wire.protocol import open_channel

FETCH_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 5.0


async def fetch(
    source: dict[str, Any], *, tier: Path, gen: int, host: str, secret: str
) -> dict[str, Any]:
    """Fetch `source` ({"addr", "port", "which", "ranks"}, and "into": "replica" to keep them
    as replicas) into `tier`; returns the report the controller journals (`peer_fetched`)."""
    ranks = [int(r) for r in source["ranks"]]
    report: dict[str, Any] = {
        "source": f"{source['addr']}:{source['port']}",
        "which": source["which"],
        "ranks": ranks,
        "snapshots": [],
        "bytes": 0,
    }
    t0 = time.monotonic()
    try:
        await asyncio.wait_for(
            _fetch(source, ranks, tier, gen, host, secret, report), FETCH_TIMEOUT_S
        )
    except asyncio.TimeoutError:
        report["error"] = f"not done in {FETCH_TIMEOUT_S:g} s"
    except (OSError, ConnectionError, asyncio.IncompleteReadError) as e:
        report["error"] = f"{type(e).__name__}: {e}"
    except (ProtocolError, Invalid, UnsafePathError) as e:
        report["error"] = str(e)
    report["seconds"] = round(time.monotonic() - t0, 4)
    return report


async def _fetch(
    source: dict[str, Any],
    ranks: list[int],
    tier: Path,
    gen: int,
    host: str,
    secret: str,
    report: dict[str, Any],
) -> None:
    # A spare takes over the ranks it fetches: under their names. A host joining a re-planned
    # job runs other ranks: the old ones' snapshots are kept as replicas, which the restore's
    # scan reads (peer_plan.py).
    into = files.replica_dir if source.get("into") == "replica" else files.rank_dir
    chan = await open_channel(
        source["addr"], int(source["port"]), secret, CONNECT_TIMEOUT_S, server=Role.PEER
    )
    try:
        chan.send("hello", role="peer", host=host, gen=gen)
        # A joining host keeps what it fetches on top of its own ranks' slots: only the newest
        # that together hold every tensor (PeerStore._answer).
        chan.send("fetch", ranks=ranks, which=source["which"], cover=into is files.replica_dir)
        while True:
            msg = await chan.receive()
            if msg["kind"] == "fetched":
                return
            if msg["kind"] != "snapshot":
                raise ProtocolError(f"expected a snapshot, got {msg['kind']!r}")
            rank = int(msg["rank"])
            if rank not in ranks:
                raise ProtocolError(f"sent rank {rank}, which was not asked for")
            snap = await wire.receive_snapshot(chan, msg, into(tier, rank))
            if snap is not None:
                report["snapshots"].append([rank, snap.step, snap.generation])
                report["bytes"] += snap.data_size + len(snap.manifest) + int(msg["objects_size"])
    finally:
        chan.close()
