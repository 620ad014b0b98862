"""messages.py: what each role may say, field by field (table-driven), and the honest messages
the real senders build pass."""

from __future__ import annotations

import pytest

from ftrun.errors import ProtocolError
from ftrun.wire.messages import MAX_LINE, SCHEMAS, Role, validate
from ftrun.wire.protocol import VERSION


def body(kind: str, **fields):
    return {"v": VERSION, "kind": kind, "seq": 1, **fields}


HONEST = [
    (Role.AGENT, body("hello", agent_id="node1#0", host="node1", pid=42, addr="10.0.0.1", port=1)),
    (Role.AGENT, body("heartbeat", gen=None)),
    (Role.AGENT, body("rank_started", gen=1, rank=3, pid=99)),
    (Role.AGENT, body("pace", gen=1, ranks={"0": [40, 10, 3.2, 0.17], "1": [40, 10, 3.2, 0.3]})),
    (
        Role.AGENT,
        body(
            "rank_exited",
            gen=1,
            rank=3,
            pid=99,
            exit_code=1,
            signal=None,
            t_exit=1.7e9,
            step=12,
            tail=["Traceback", "boom"],
            traceback="Traceback...",
            exception="RuntimeError: boom",
            traceback_source="log",
            usage_error=False,
        ),
    ),
    (
        Role.AGENT,
        body(
            "rank_hung",
            gen=2,
            step=5,
            detected_t=1.7e9,
            rank=1,
            rank_step=5,
            last_progress_t=1.7e9,
            allowance_s=3.0,
            section=None,
            stacks={"1": "Thread 0x1"},
            states={"1": "sleeping", "0": None},
            overdue=[1],
            tail=[],
        ),
    ),
    (Role.AGENT, body("progress", gen=1, rank=None, step=4, first=False, t=1.7e9)),
    (Role.AGENT, body("log", gen=1, rank=None, lines=["torchrun says hi"])),
    (Role.AGENT, body("idle", gen=1, ranks={"0": 1.5})),
    (Role.AGENT, body("idle", gen=1, ranks=None)),
    (Role.AGENT, body("stacks", gen=1, stacks={}, states={}, tails={"0": ["x"]})),
    (Role.AGENT, body("stopped", gen=1, survivors=[], port=5000)),
    (Role.AGENT, body("gen_exited", gen=1, exit_code=0, tail=[])),
    (Role.AGENT, body("log", gen=1, rank=0, lines=["x"], shrunk="too big")),
    (Role.CLIENT, body("hello", role="client")),
    (Role.CLIENT, body("chaos", action="kill-rank", rank=1, host=None, at_step=None)),
    (Role.CLIENT, body("hosts", action="add", host="node4")),
    (Role.CONTROLLER, body("launch", gen=3, nnodes=2, env={"A": "b"})),
    (Role.CONTROLLER, body("stop", gen=None, grace_s=0)),
    (Role.CONTROLLER, body("chaos_ack", ok=False, message="no")),
]


@pytest.mark.parametrize("role, msg", HONEST, ids=[f"{r.value}-{m['kind']}" for r, m in HONEST])
def test_honest_messages_pass(role, msg):
    assert validate(role, msg) is msg


FORGED = [
    # the controller's own kinds are no one's to send
    (Role.AGENT, body("agent_lost", reason="x"), "may not send"),
    (Role.CLIENT, body("stop_requested"), "may not send"),
    (Role.AGENT, body("preempt_notice", signal="USR1"), "may not send"),
    # a client is not an agent, and an agent is not a client
    (Role.CLIENT, body("rank_exited", gen=1, rank=0, exit_code=1), "may not send"),
    (Role.AGENT, body("chaos", action="kill-rank", rank=0), "may not send"),
    # types, ranges, lengths
    (Role.AGENT, body("log", gen=1, rank="/../x", lines=[]), "not an integer"),
    (Role.AGENT, body("log", gen=1, rank=-1, lines=[]), "out of range"),
    (Role.AGENT, body("log", gen=1, rank=True, lines=[]), "not an integer"),
    (Role.AGENT, body("log", gen=1, rank=0, lines="x"), "not a list"),
    (Role.AGENT, body("log", gen=1, rank=0, lines=["a" * (MAX_LINE + 1)]), "over"),
    (Role.AGENT, body("log", gen=1, rank=0), "missing field 'lines'"),
    (Role.AGENT, body("progress", gen=1, t=float("nan")), "out of range"),
    (Role.AGENT, body("stacks", gen=1, stacks={"../x": "s"}), "not a rank"),
    (Role.AGENT, body("rank_started", gen=1, rank=0, pid=1, path="/etc"), "unknown field"),
    (Role.CLIENT, body("chaos", action="x" * 100_000), "over"),
    (Role.CLIENT, body("chaos", action="rm-rf"), "not one of"),
    (Role.CLIENT, body("hello", role="agent"), "not one of"),
    (Role.CONTROLLER, body("stop", gen=1, grace_s="soon"), "not a number"),
    (Role.CONTROLLER, body("launch"), "missing field 'gen'"),
]


@pytest.mark.parametrize("role, msg, why", FORGED, ids=[m["kind"] for _, m, _ in FORGED])
def test_forged_or_malformed_messages_are_refused_with_the_reason(role, msg, why):
    with pytest.raises(ProtocolError, match=why):
        validate(role, msg)


def test_every_required_field_has_a_type():
    for role, kinds in SCHEMAS.items():
        for kind, schema in kinds.items():
            missing = [f for f in schema.required if f not in schema.fields]
            assert not missing, f"{role.value} {kind}: required but untyped: {missing}"
