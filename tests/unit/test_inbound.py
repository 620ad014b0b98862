"""inbound.py: one class per kind the controller receives, held equal to its schema (the two
cannot drift), and the edge's decoding of honest messages into them."""

from __future__ import annotations

import dataclasses

import pytest

from ftrun.wire import inbound
from ftrun.wire.inbound import CLASSES, CheckpointTier, Hello, Progress, Stopped, typed, wire_name
from ftrun.wire.messages import SCHEMAS, Role, validate
from ftrun.wire.protocol import VERSION
from ftrun.wire.schema import Bool, ByRank, Field, Int, Json, ListOf, Num, Str
from tests.unit.test_messages import HONEST

RECEIVED = (Role.AGENT, Role.CLIENT)  # what the controller takes in from the wire


def annotation(f: Field, *, optional: bool = False) -> str:
    """The Python type a schema field allows, as the class writes it."""
    if isinstance(f, Int):
        text = "int"
    elif isinstance(f, Num):
        text = "float"
    elif isinstance(f, Bool):
        text = "bool"
    elif isinstance(f, Str):
        text = "str"
    elif isinstance(f, ListOf):
        text = f"list[{annotation(f.item)}]"
    elif isinstance(f, ByRank):
        text = f"dict[str, {annotation(f.value)}]"
    elif isinstance(f, Json):
        return "Any"
    else:
        raise AssertionError(f"no annotation for {f!r}")
    return f"{text} | None" if optional or f.nullable else text


@pytest.mark.parametrize("role", RECEIVED)
def test_every_kind_a_role_may_send_has_a_class_and_no_class_is_extra(role):
    assert set(CLASSES[role]) == set(SCHEMAS[role])
    for kind, cls in CLASSES[role].items():
        assert cls.KIND == kind


@pytest.mark.parametrize(
    "role, kind", [(role, kind) for role in RECEIVED for kind in sorted(SCHEMAS[role])]
)
def test_each_class_has_its_schemas_fields_their_types_and_which_are_required(role, kind):
    schema, cls = SCHEMAS[role][kind], CLASSES[role][kind]
    fields = {wire_name(f): f for f in dataclasses.fields(cls)}
    assert set(fields) == set(schema.fields), kind
    for name, f in fields.items():
        required = name in schema.required
        no_default = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        assert no_default == required, f"{kind}.{name}: required is {required}"
        if not required:
            assert f.default is None, f"{kind}.{name}: absent must read as None"
        want = annotation(schema.fields[name], optional=not required)
        assert f.type == want, f"{kind}.{name}: {f.type} is not {want}"


def test_the_classes_are_frozen_and_keyword_only():
    for kinds in CLASSES.values():
        for cls in kinds.values():
            params = cls.__dataclass_params__  # type: ignore[attr-defined]
            assert params.frozen, cls
            assert all(f.kw_only for f in dataclasses.fields(cls)), cls


@pytest.mark.parametrize("role, body", [(r, b) for r, b in HONEST if r in RECEIVED])
def test_every_honest_message_decodes_to_its_class_with_every_field(role, body):
    msg = typed(role, validate(role, body))
    assert type(msg) is CLASSES[role][body["kind"]]
    for f in dataclasses.fields(msg):
        assert getattr(msg, f.name) == body.get(wire_name(f)), f.name


def test_absent_fields_read_as_none_and_python_names_map_back_to_the_wire():
    hello = typed(Role.AGENT, {"v": VERSION, "kind": "hello", "seq": 1, "agent_id": "a#0"})
    assert hello == Hello(agent_id="a#0") and hello.port is None and hello.gen is None
    tier = {"kind": "checkpoint_tier", "gen": 1, "rank": 0, "tier": "storage", "from": "live"}
    assert typed(Role.AGENT, tier) == CheckpointTier(gen=1, rank=0, tier="storage", from_="live")
    assert typed(Role.AGENT, {"kind": "stopped", "port": 9}) == Stopped(port=9)
    assert isinstance(typed(Role.AGENT, {"kind": "progress", "gen": 1}), inbound.Report)
    assert typed(Role.AGENT, {"kind": "progress", "gen": 1}) == Progress(gen=1)


def test_a_client_hello_is_not_an_agents():
    msg = typed(Role.CLIENT, {"kind": "hello", "role": "chaos"})
    assert isinstance(msg, inbound.ClientHello) and not isinstance(msg, Hello)


def test_messages_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Progress(gen=1).step = 3  # type: ignore[misc]


def test_pick_gives_fields_by_their_wire_names_and_refuses_a_name_the_class_lacks():
    tier = CheckpointTier(gen=1, rank=2, tier="copies", from_="live", why="room")
    assert inbound.pick(tier, ("rank", "from", "tier")) == {
        "rank": 2,
        "from": "live",
        "tier": "copies",
    }
    with pytest.raises(AttributeError):
        inbound.pick(tier, ("frm",))


def test_the_journals_field_lists_are_fields_of_their_messages():
    from ftrun.controller import generation as g

    exited = inbound.RankExited(gen=1, rank=0, exception="E")
    assert inbound.pick(exited, g.EXIT_FIELDS + g.EXIT_EVIDENCE)["exception"] == "E"
    assert set(inbound.pick(inbound.PeerFetched(gen=1, ranks=[0]), g.PEER_FETCHED_FIELDS))
    assert (
        inbound.pick(CheckpointTier(gen=1, rank=0, tier="storage"), g.TIER_FIELDS)["from"] is None
    )


def test_the_link_checks_report_lives_beside_the_health_checks_and_decodes_like_the_rest():
    from ftrun.wire.inbound_checks import LinkProbed

    body = {
        "v": VERSION,
        "kind": "link_probed",
        "seq": 1,
        "gen": None,
        "check": 1,
        "rounds": [1, 2],
        "peers": ["node2", "node4"],
        "latency_s": [0.0002, None],
        "bandwidth_Bps": [4.5e8, None],
        "errors": [None, "timed out"],
        "port": 40001,
    }
    msg = typed(Role.AGENT, validate(Role.AGENT, body))
    assert isinstance(msg, LinkProbed) and isinstance(msg, inbound.Report)
    assert msg.errors == [None, "timed out"] and msg.port == 40001
