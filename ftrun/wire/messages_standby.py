"""The standby controller's messages (controller/standby_desk.py, agent/standby.py), in the
schema table of messages.py.

- controller → agent `standby`: where the standby controller listens, to dial there when the
  primary is gone; to the standby host's own agent with port 0: "be the standby, pick a port".
- agent → controller `standby_ready`: the port the standby host's agent picked.
- controller → the standby's agent `replicate`: a job file, whole or a piece to append (the
  journal), so the standby needs no shared filesystem.
- controller → agent `term`: the leading controller's term (its run of the job); an agent's
  host keeps the highest, and refuses what an older term orders (docs/standby.md).
- controller → agent `heartbeat`, with `acked`: the highest of the agent's numbered output
  messages (`oseq`) it has written; the agent sends the rest again to the next controller, so
  output survives a takeover (agent/unacked.py, controller/output_acks.py).
"""

from __future__ import annotations

from ftrun.wire.schema import GEN, OSEQ, PORT, Bool, Schema, Str, opt

# What a standby keeps of the job directory: what `ftrun resume` reads.
REPLICATED = (
    "events.jsonl",
    "config.json",
    "control.json",
    "control.tls",
    "checkpoint.key",
)
REPLICA_CHUNK = 256 * 1024  # characters of one `replicate` message (a frame is 1 MiB)

AGENT_KINDS = {"standby_ready": Schema({"port": PORT}, ("port",))}
CONTROLLER_KINDS = {
    "heartbeat": Schema({"acked": opt(OSEQ)}),
    "standby": Schema(
        {"host": Str(), "addr": opt(Str()), "port": PORT, "term": GEN, "dir": opt(Str(4096))},
        ("host", "port", "term"),
    ),
    "replicate": Schema(
        {"file": Str(64, choices=REPLICATED), "data": Str(REPLICA_CHUNK), "append": Bool()},
        ("file", "data", "append"),
    ),
    "term": Schema({"term": GEN}, ("term",)),
}
