"""What each peer of the control plane may say: a schema for every message kind, by role.

Authentication (protocol.py) proves a message came from a holder of the job's keys; it does not
make the message well-formed or the sender entitled to it. So every message is checked here
before anything reads it: its kind must be one its sender's role may send, each field must have
its type, range and length, and no field may be unknown. A message that fails is dropped and
logged by the caller, never passed on, so no reader further in has to defend itself against
`"rank": "/../x"` or a 1 MiB action name. The field types and bounds the schemas are written
in are message_schema.py's.

Roles:
- AGENT: a per-host agent, to the controller;
- CLIENT: a `ftrun chaos` / `ftrun hosts` client (it holds control.json), to the controller;
- CONTROLLER: the controller, to an agent or a client;
- PEER: an agent to another agent's peer store, and that store's answers (ftrun/peercopy).
Kinds the controller makes for itself (`agent_lost`, `stop_requested`, `preempt_notice`) are in
no role's list: from the wire they are refused.
"""

from __future__ import annotations

import enum
from typing import Any

from ftrun.errors import ProtocolError
from ftrun.wire import messages_standby as standby
from ftrun.wire.schema import (
    CHAOS_ACTIONS,
    EXIT_CODE,
    GEN,
    LINES,
    MAX_LINE,
    MAX_RANKS,
    OSEQ,
    PEER_SOURCES,
    PID,
    PORT,
    RANK,
    SECONDS,
    SIGNAL,
    STEP,
    TEXT,
    WALL_T,
    Bool,
    ByRank,
    Int,
    ListOf,
    Num,
    Schema,
    Str,
    opt,
)


class Role(enum.Enum):
    AGENT = "agent"
    CLIENT = "client"
    CONTROLLER = "controller"
    PEER = "peer"


AGENT_REPORT = {"gen": opt(GEN), "shrunk": Str(MAX_LINE), "oseq": opt(OSEQ)}  # link.py, unacked.py

SCHEMAS: dict[Role, dict[str, Schema]] = {
    Role.AGENT: {
        "hello": Schema(
            {
                "role": Str(16, choices=("agent",)),
                "agent_id": Str(),  # and one the controller started: server.py checks
                "host": Str(),
                "pid": PID,
                "addr": Str(),
                "port": PORT,
                "gen": opt(GEN),  # the generation running here (a rejoin after an outage)
                "rejoin": Bool(),
                "peer_port": opt(PORT),  # where its peer store listens (ftrun/peercopy)
                "shm_total": opt(Int(0, 1 << 60)),  # /dev/shm's size and free space, bytes
                "shm_free": opt(Int(0, 1 << 60)),
                "python": opt(Str(32)),  # the host's Python and torch versions, its clock
                "torch": opt(Str(64)),
                "wall_t": opt(WALL_T),
            },
            required=("agent_id",),
        ),
        "heartbeat": Schema({"gen": opt(GEN)}),
        "rank_started": Schema({**AGENT_REPORT, "rank": RANK, "pid": PID}, ("gen", "rank")),
        "rank_exited": Schema(
            {
                **AGENT_REPORT,
                "rank": RANK,
                "pid": opt(PID),
                "exit_code": opt(EXIT_CODE),
                "signal": opt(SIGNAL),
                "t_exit": opt(WALL_T),
                "step": opt(STEP),
                "tail": LINES,
                "traceback": opt(TEXT),
                "exception": opt(Str(MAX_LINE)),
                "traceback_source": opt(Str(32)),
                "usage_error": Bool(),
            },
            ("gen", "rank"),
        ),
        "rank_hung": Schema(
            {
                **AGENT_REPORT,
                "step": opt(STEP),
                "detected_t": opt(WALL_T),
                "rank": RANK,
                "rank_step": opt(STEP),
                "last_progress_t": opt(WALL_T),
                "allowance_s": opt(SECONDS),
                "section": opt(Str()),
                "stacks": ByRank(TEXT),
                "states": ByRank(opt(Str(64))),
                "overdue": ListOf(RANK, MAX_RANKS),
                "tail": LINES,
                "why": opt(Str(16, choices=("section", "stopped", "spinning"))),
            },
            ("gen", "rank"),
        ),
        "progress": Schema(
            {
                **AGENT_REPORT,
                "rank": opt(RANK),
                "step": opt(STEP),
                "first": Bool(),
                "t": WALL_T,
                "stall_s": SECONDS,
            },
            ("gen",),
        ),
        "log": Schema({**AGENT_REPORT, "rank": opt(RANK), "lines": LINES}, ("gen", "lines")),
        "checkpoint_committed": Schema(
            {**AGENT_REPORT, "rank": RANK, "step": opt(STEP), "preempt": Bool()}, ("gen", "rank")
        ),
        "checkpoint_restored": Schema(
            {
                **AGENT_REPORT,
                "rank": RANK,
                "step": opt(STEP),
                "tier": Str(16, choices=("memory", "storage", "none")),
                "restore_s": opt(SECONDS),
                "skipped": opt(ListOf(Str(MAX_LINE), 4)),
            },
            ("gen", "rank"),
        ),
        # A rank's memory tier stepped down (checkpoint/capacity.py); bytes, -1 where unknown.
        "checkpoint_tier": Schema(
            {
                **AGENT_REPORT,
                "rank": RANK,
                "tier": Str(16, choices=("live", "copies", "storage")),
                "from": Str(16, choices=("live", "copies", "storage")),
                "why": Str(MAX_LINE),
                "need": Int(-1, 1 << 60),
                "free": Int(-1, 1 << 60),
                "total": Int(-1, 1 << 60),
            },
            ("gen", "rank", "tier"),
        ),
        "signalled": Schema(
            {**AGENT_REPORT, "signal": SIGNAL, "ranks": ListOf(RANK, MAX_RANKS)}, ("gen",)
        ),
        "peer_fetched": Schema(
            {
                **AGENT_REPORT,
                "source": Str(),
                "which": Str(16, choices=PEER_SOURCES),
                "ranks": ListOf(RANK, MAX_RANKS),
                "snapshots": ListOf(ListOf(STEP, 3), MAX_RANKS * 3),  # [rank, step, generation]
                "bytes": Int(0, 1 << 50),
                "seconds": SECONDS,
                "error": opt(Str(MAX_LINE)),
            },
            ("gen", "ranks"),
        ),
        "injected": Schema(
            {
                **AGENT_REPORT,
                "action": Str(32, choices=CHAOS_ACTIONS),
                "rank": opt(RANK),
                "host": Str(),
                "t": WALL_T,
            },
            ("gen", "action"),
        ),
        # overdue: the ranks here past their hang allowance (rank → allowance), when every
        # rank here has been waiting together: a suspected deadlock (agent/verdict.py).
        "idle": Schema(
            {
                **AGENT_REPORT,
                "ranks": opt(ByRank(SECONDS)),
                "overdue": opt(ByRank(SECONDS)),
                "overdue_at": opt(ByRank(WALL_T)),  # when each one's allowance ran out
            },
            ("gen",),
        ),
        # each rank's finished window of steps (agent/pace.py): [its last step, steps, wall
        # seconds, compute seconds a step]
        "pace": Schema({**AGENT_REPORT, "ranks": ByRank(ListOf(SECONDS, 4))}, ("gen", "ranks")),
        # every live rank on the host stuck in torch's gloo deadlock at exit (agent/verdict.py)
        "exit_race": Schema(
            {**AGENT_REPORT, "ranks": ListOf(RANK, MAX_RANKS), "stacks": ByRank(TEXT)}, ("gen",)
        ),
        "stacks": Schema(
            {
                **AGENT_REPORT,
                "stacks": ByRank(TEXT),
                "states": ByRank(opt(Str(64))),
                "tails": ByRank(LINES),
            },
            ("gen",),
        ),
        # the link check's figures for each round this host was in (agent/link_probe.py), and a
        # fresh port of its host for the rendezvous (the check used the one its hello offered)
        "link_probed": Schema(
            {
                **AGENT_REPORT,
                "check": GEN,
                "rounds": ListOf(Int(1, 8), 8),
                "peers": ListOf(Str(), 8),
                "latency_s": ListOf(opt(SECONDS), 8),
                "bandwidth_Bps": ListOf(opt(Num(0.0, 1e15)), 8),
                "errors": ListOf(opt(Str(MAX_LINE)), 8),
                "port": opt(PORT),
            },
            ("gen", "check", "rounds", "peers", "latency_s", "bandwidth_Bps", "errors"),
        ),
        "gen_exited": Schema({**AGENT_REPORT, "exit_code": EXIT_CODE, "tail": LINES}, ("gen",)),
        "stopped": Schema(
            {**AGENT_REPORT, "survivors": ListOf(PID, MAX_RANKS), "port": PORT}, ("port",)
        ),
        "agent_error": Schema(
            {
                **AGENT_REPORT,
                "host": Str(),
                "task": Str(MAX_LINE),
                "error": Str(MAX_LINE),
                "traceback": opt(TEXT),
                "restarting": Bool(),
                "fatal": Bool(),
            },
            ("task", "error"),
        ),
        **standby.AGENT_KINDS,
    },
    Role.CLIENT: {
        "hello": Schema({"role": Str(16, choices=("client", "chaos"))}, ("role",)),
        "chaos": Schema(
            {
                "action": Str(32, choices=CHAOS_ACTIONS),
                "rank": opt(RANK),
                "host": opt(Str()),
                "at_step": opt(STEP),
            },
            ("action",),
        ),
        "hosts": Schema({"action": Str(16, choices=("add", "remove")), "host": Str()}, ("action",)),
    },
    Role.PEER: {
        "hello": Schema({"role": Str(16, choices=("peer",)), "host": Str(), "gen": GEN}, ("gen",)),
        # a snapshot follows as blobs: its manifest, its objects, its data (ftrun/peercopy/wire.py)
        "snapshot": Schema(
            {
                "rank": RANK,
                "slot": Int(0, 2),
                "step": STEP,
                "generation": GEN,
                "manifest_size": Int(0, 1 << 20),
                "objects_size": Int(0, 1 << 30),
                "data_size": Int(0, 1 << 44),
            },
            ("rank", "slot", "step", "generation", "manifest_size", "objects_size", "data_size"),
        ),
        "end": Schema({"ok": Bool()}, ("ok",)),  # the snapshot did not change while it was sent
        "fetch": Schema(
            {
                "ranks": ListOf(RANK, MAX_RANKS),
                "which": Str(16, choices=PEER_SOURCES),
                "cover": opt(Bool()),  # the newest that hold every tensor (a joining host)
            },
            ("ranks", "which"),
        ),
        "fetched": Schema({"count": Int(0, MAX_RANKS * 3)}, ("count",)),
        "refused": Schema({"message": Str(MAX_LINE)}, ("message",)),
    },
    Role.CONTROLLER: {
        "launch": Schema({"gen": GEN}, ("gen",), open=True),
        "stop": Schema({"gen": opt(GEN), "grace_s": SECONDS}),
        "signal": Schema({"gen": opt(GEN), "signal": SIGNAL}, ("signal",)),
        "preempt": Schema({"gen": opt(GEN), "signal": SIGNAL}, ("signal",)),
        "persist": Schema({"gen": opt(GEN)}),  # persist the next save at once (a grow)
        "inject": Schema(
            {
                "gen": GEN,
                "action": Str(32, choices=CHAOS_ACTIONS),
                "rank": opt(RANK),
                "at_step": opt(STEP),
            },
            ("gen", "action"),
        ),
        "finishing": Schema({"gen": GEN}, ("gen",)),
        "capture_stacks": Schema({"gen": opt(GEN)}),
        # the link check (controller/link_check.py): this host's rounds, each with its peer,
        # where the pair's store is, and this host's rank in the pair (0: it holds the store)
        "link_check": Schema(
            {
                "check": GEN,
                "timeout_s": SECONDS,
                "rounds": ListOf(Int(1, 8), 8),
                "peers": ListOf(Str(), 8),
                "addrs": ListOf(Str(), 8),
                "ports": ListOf(PORT, 8),
                "ranks": ListOf(Int(0, 1), 8),
            },
            ("check", "timeout_s", "rounds", "peers", "addrs", "ports", "ranks"),
        ),
        "shutdown": Schema({}),
        "fence": Schema({"reason": Str(MAX_LINE)}),  # an agent we no longer count on: fence now
        "chaos_ack": Schema({"ok": Bool(), "message": opt(Str(MAX_LINE))}, ("ok",)),
        "hosts_ack": Schema({"ok": Bool(), "message": opt(Str(MAX_LINE))}, ("ok",)),
        # a client's request that its schema refuses: said to it, rather than left unanswered
        "refused": Schema({"message": Str(MAX_LINE)}, ("message",)),
        **standby.CONTROLLER_KINDS,
    },
}
ENVELOPE = ("v", "kind", "seq")  # protocol.py's own fields, checked there


def validate(role: Role, body: dict[str, Any]) -> dict[str, Any]:
    """The body if `role` may send it as it is; ProtocolError naming the first problem."""
    kind = body.get("kind")
    schema = SCHEMAS[role].get(kind) if isinstance(kind, str) else None
    if schema is None:
        raise ProtocolError(f"a {role.value} may not send {str(kind)[:40]!r}")
    for name in schema.required:
        if name not in body:
            raise ProtocolError(f"{kind}: missing field {name!r}")
    for name, value in body.items():
        if name in ENVELOPE:
            continue
        field = schema.fields.get(name)
        if field is None:
            if schema.open:
                continue
            raise ProtocolError(f"{kind}: unknown field {name[:40]!r}")
        if (why := field.check(value)) is not None:
            raise ProtocolError(f"{kind}: field {name!r} {why}")
    return body
