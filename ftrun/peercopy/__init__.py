"""The peer tier: each host's memory snapshots also kept in another host's memory (docs/peercopy.md).

While a generation trains, each agent streams the newest memory snapshot of its ranks to the
next host of the generation (a ring), which keeps them as a replica in its own /dev/shm. When a
host is lost and a spare takes its node rank, the spare's agent fetches those ranks' snapshots
from the replica before it starts them, so they restore from memory, not storage.

    files.py       a rank's snapshot files: read one consistently while the rank writes, write
                   one in the order that makes it all-or-nothing
    wire.py        a snapshot over an authenticated agent-to-agent connection, paced
    store.py       the server every agent runs: keeps replicas pushed to it, serves fetches
    replicator.py  the loop that pushes this host's new snapshots to its peer
    fetch.py       what a spare does before its ranks start: fetch their snapshots

The agents only move bytes: they never parse tensors nor hold a checkpoint key. What they move
is checked where it is used, by the ranks' restore (manifest HMAC, sealed objects), and on the
way by the connection's per-frame HMAC under the job secret.
"""
