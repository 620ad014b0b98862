"""Where each host's memory snapshots are copied to, and where a host that takes over another's
ranks fetches theirs from (the peer tier, ftrun/peercopy, docs/peercopy.md).

Pure bookkeeping over agent ids, by node rank. The ring: node i copies its ranks' snapshots to
node i+1 (mod n). The takeover: when generation g+1 has the same number of nodes as g (a spare
took a lost host's node rank, roster.py keeps the others where they were), node i of g+1 needs
the snapshots of node i of g. They are where that node ran if its agent is still up (its own
memory tier: "primary"), and in the replica kept by its ring neighbour in g ("replica"): both are
listed, in that order, when up (a primary that never snapshotted, a spare lost before its first
step, leaves the replica to try).

With another number of nodes the ranks reshard (a shrink, a grow, a new DP x PP plan): each rank
loads what its new layout needs from every snapshot its host holds (checkpoint/restore.py). The
hosts of g hold their old ranks' snapshots; a host joining in g+1 holds none, so it fetches one
old node's ranks ("primary", node i mod the old count, then the others that are up, in turn, as
fallbacks) into its replica directory (`"into": "replica"`), where the restore's scan finds
them. In data parallel any old rank holds every tensor; in a pipeline one old node may not hold
every stage a new rank needs, and that rank restores from storage, as it did before 2026-11-26.
"""

from __future__ import annotations

from typing import Any

Address = tuple[str, int]


def peer_fields(
    agents: list[str],
    previous: list[str],
    where: dict[str, Address],
    *,
    nproc_per_node: int,
    rate_bytes_s: float,
) -> list[dict[str, Any]]:
    """The `peer` field of each node's launch, by node rank. `where`: the peer store of each
    agent that is up; `previous`: the last generation's agents by node rank."""
    n = len(agents)
    fields: list[dict[str, Any]] = []
    for i, agent in enumerate(agents):
        to = where.get(agents[(i + 1) % n]) if n > 1 and rate_bytes_s > 0 else None
        fields.append({"to": list(to) if to else None, "rate": rate_bytes_s, "fetch": []})
        if rate_bytes_s <= 0:
            continue
        if len(previous) != n:
            if previous and agent not in previous:
                fields[i]["fetch"] = _joining(i, previous, where, nproc_per_node)
            continue
        if previous[i] == agent:
            continue
        ranks = list(range(i * nproc_per_node, (i + 1) * nproc_per_node))
        holder = previous[(i + 1) % n]
        sources = [(previous[i], "primary")] + ([(holder, "replica")] if n > 1 else [])
        fields[i]["fetch"] = [
            {"addr": where[agent][0], "port": where[agent][1], "which": which, "ranks": ranks}
            for agent, which in sources
            if agent in where
        ]
    return fields


def _joining(
    i: int, previous: list[str], where: dict[str, Address], nproc_per_node: int
) -> list[dict[str, Any]]:
    """A host joining at node rank i: one old node's ranks, from that node's own memory, into
    the joining host's replica directory; the old nodes that are up, from node i mod their count."""
    old = len(previous)
    fetch = []
    for k in range(old):
        j = (i + k) % old
        if previous[j] in where:
            addr, port = where[previous[j]]
            ranks = list(range(j * nproc_per_node, (j + 1) * nproc_per_node))
            fetch.append(
                {"addr": addr, "port": port, "which": "primary", "ranks": ranks, "into": "replica"}
            )
    return fetch
