"""Where each host's memory snapshots are copied to, and where a host that takes over another's
ranks fetches theirs from (the peer tier, ftrun/peercopy, docs/peercopy.md).

Pure bookkeeping over agent ids, by node rank. The ring: node i copies its ranks' snapshots to
node i+1 (mod n). The takeover: when generation g+1 has the same number of nodes as g (a spare
took a lost host's node rank, roster.py keeps the others where they were), node i of g+1 needs
the snapshots of node i of g. They are where that node ran if its agent is still up (its own
memory tier: "primary"), and in the replica kept by its ring neighbour in g ("replica"): both are
listed, in that order, when up (a primary that never snapshotted, a spare lost before its first
step, leaves the replica to try). With another number of nodes the ranks reshard from storage: nothing to fetch.
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
        if len(previous) != n or previous[i] == agent or rate_bytes_s <= 0:
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
