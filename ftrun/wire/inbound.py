"""What the controller receives, typed: one frozen dataclass per message kind, made once at the
edge (the control server, right after messages.py has validated the body) so that nothing
further in reads a dict or compares a kind string: a desk matches on the class.

The classes are written beside the schemas (messages.SCHEMAS) and a test holds them equal
(tests/unit/test_inbound.py): each has exactly its schema's fields, a required field has no
default, a field's type is what its schema allows (`X | None` where it may be null or absent:
absent reads as None). Lists and maps are kept as the JSON gave them: a message is read only.

Beside the wire's kinds, those the controller makes for itself: AgentLost (server.py: a closed
connection, or silence), StopRequested and PreemptNotice (job_signals.py): from the wire they
are refused. (The agents and the peer copy still read Channel's dicts.) The base classes are
inbound_base.py's; the health checks' messages, inbound_checks.py's."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ftrun.wire.inbound_base import Message, Report
from ftrun.wire.inbound_checks import LinkProbed, StandbyReady
from ftrun.wire.messages import ENVELOPE, Role

# ---- agent → controller --------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Hello(Message):
    KIND = "hello"
    role: str | None = None
    agent_id: str
    host: str | None = None
    pid: int | None = None
    addr: str | None = None
    port: int | None = None
    gen: int | None = None  # the generation running there (a rejoin after an outage)
    rejoin: bool | None = None
    peer_port: int | None = None
    shm_total: int | None = None
    shm_free: int | None = None
    python: str | None = None  # what the ranks run there, and its clock (host_checks.py)
    torch: str | None = None
    wall_t: float | None = None


@dataclass(frozen=True, kw_only=True)
class Heartbeat(Message):
    KIND = "heartbeat"
    gen: int | None = None


@dataclass(frozen=True, kw_only=True)
class RankStarted(Report):
    KIND = "rank_started"
    rank: int
    pid: int | None = None


@dataclass(frozen=True, kw_only=True)
class RankExited(Report):
    KIND = "rank_exited"
    rank: int
    pid: int | None = None
    exit_code: int | None = None
    signal: str | None = None
    t_exit: float | None = None
    step: int | None = None
    tail: list[str] | None = None
    traceback: str | None = None
    exception: str | None = None
    traceback_source: str | None = None
    usage_error: bool | None = None


@dataclass(frozen=True, kw_only=True)
class RankHung(Report):
    KIND = "rank_hung"
    step: int | None = None
    detected_t: float | None = None
    rank: int
    rank_step: int | None = None
    last_progress_t: float | None = None
    allowance_s: float | None = None
    section: str | None = None
    stacks: dict[str, str] | None = None
    states: dict[str, str | None] | None = None
    overdue: list[int] | None = None
    tail: list[str] | None = None
    why: str | None = None


@dataclass(frozen=True, kw_only=True)
class Progress(Report):
    KIND = "progress"
    rank: int | None = None
    step: int | None = None
    first: bool | None = None
    t: float | None = None
    stall_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class Log(Report):
    KIND = "log"
    rank: int | None = None  # None: torchrun's own output
    lines: list[str]


@dataclass(frozen=True, kw_only=True)
class CheckpointCommitted(Report):
    KIND = "checkpoint_committed"
    rank: int
    step: int | None = None
    preempt: bool | None = None


@dataclass(frozen=True, kw_only=True)
class CheckpointRestored(Report):
    KIND = "checkpoint_restored"
    rank: int
    step: int | None = None
    tier: str | None = None
    restore_s: float | None = None
    skipped: list[str] | None = None


@dataclass(frozen=True, kw_only=True)
class CheckpointTier(Report):
    KIND = "checkpoint_tier"
    rank: int
    tier: str
    from_: str | None = field(default=None, metadata={"wire": "from"})
    why: str | None = None
    need: int | None = None
    free: int | None = None
    total: int | None = None


@dataclass(frozen=True, kw_only=True)
class Signalled(Report):
    KIND = "signalled"
    signal: str | None = None
    ranks: list[int] | None = None


@dataclass(frozen=True, kw_only=True)
class PeerFetched(Report):
    KIND = "peer_fetched"
    source: str | None = None
    which: str | None = None
    ranks: list[int]
    snapshots: list[list[int]] | None = None
    bytes: int | None = None
    seconds: float | None = None
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class Injected(Report):
    KIND = "injected"
    action: str
    rank: int | None = None
    host: str | None = None
    t: float | None = None


@dataclass(frozen=True, kw_only=True)
class RanksIdle(Report):
    KIND = "idle"
    ranks: dict[str, float] | None = None
    overdue: dict[str, float] | None = None
    overdue_at: dict[str, float] | None = None


@dataclass(frozen=True, kw_only=True)
class ExitRace(Report):
    KIND = "exit_race"
    ranks: list[int] | None = None
    stacks: dict[str, str] | None = None


@dataclass(frozen=True, kw_only=True)
class Stacks(Report):
    KIND = "stacks"
    stacks: dict[str, str] | None = None
    states: dict[str, str | None] | None = None
    tails: dict[str, list[str]] | None = None


@dataclass(frozen=True, kw_only=True)
class GenExited(Report):
    KIND = "gen_exited"
    exit_code: int | None = None
    tail: list[str] | None = None


@dataclass(frozen=True, kw_only=True)
class Stopped(Report):
    KIND = "stopped"
    gen: int | None = None
    survivors: list[int] | None = None
    port: int


@dataclass(frozen=True, kw_only=True)
class AgentError(Report):
    KIND = "agent_error"
    gen: int | None = None
    host: str | None = None
    task: str
    error: str
    traceback: str | None = None
    restarting: bool | None = None
    fatal: bool | None = None


# ---- client (`ftrun chaos`, `ftrun hosts`) → controller ------------------------------------


@dataclass(frozen=True, kw_only=True)
class ClientHello(Message):
    KIND = "hello"
    role: str


@dataclass(frozen=True, kw_only=True)
class Chaos(Message):
    KIND = "chaos"
    action: str
    rank: int | None = None
    host: str | None = None
    at_step: int | None = None


@dataclass(frozen=True, kw_only=True)
class Hosts(Message):
    KIND = "hosts"
    action: str
    host: str | None = None


# ---- the controller to itself ---------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AgentLost(Message):
    """An agent's connection closed, or it was silent too long (server.py)."""

    KIND = "agent_lost"
    reason: str
    host: str
    t: float
    last_heard_t: float  # when the host was last known alive: the fault's time, near enough


@dataclass(frozen=True, kw_only=True)
class StopRequested(Message):
    """SIGINT or SIGTERM (job_signals.py)."""

    KIND = "stop_requested"


@dataclass(frozen=True, kw_only=True)
class PaceReport(Report):  # each rank's finished window of steps (agent/pace.py)
    KIND = "pace"
    ranks: dict[str, list[float]]  # rank → [its last step, steps, wall s, compute s a step]


@dataclass(frozen=True, kw_only=True)
class PreemptNotice(Message):
    """The preemption signal (job_signals.py, preemption.py)."""

    KIND = "preempt_notice"
    signal: str


# The kinds each role may send, as classes (messages.SCHEMAS's keys, role by role).
CLASSES: dict[Role, dict[str, type[Message]]] = {
    Role.AGENT: {
        c.KIND: c
        for c in (
            Hello,
            Heartbeat,
            RankStarted,
            RankExited,
            RankHung,
            Progress,
            Log,
            CheckpointCommitted,
            CheckpointRestored,
            CheckpointTier,
            Signalled,
            PeerFetched,
            Injected,
            RanksIdle,
            ExitRace,
            PaceReport,
            Stacks,
            GenExited,
            Stopped,
            AgentError,
            LinkProbed,
            StandbyReady,
        )
    },
    Role.CLIENT: {c.KIND: c for c in (ClientHello, Chaos, Hosts)},
}


def wire_name(f: dataclasses.Field[Any]) -> str:
    """A field's name in the JSON body (`from_` is `from`)."""
    return str(f.metadata.get("wire", f.name))


# class → {name on the wire: attribute}, for the few names Python cannot take as they are
_RENAMED: dict[type[Message], dict[str, str]] = {
    cls: {wire_name(f): f.name for f in dataclasses.fields(cls) if wire_name(f) != f.name}
    for kinds in CLASSES.values()
    for cls in kinds.values()
}


def typed(role: Role, body: Mapping[str, Any]) -> Message:
    """The body as its class. It must have passed messages.validate(role, body) (Channel.receive
    does that for a trusted channel): a kind or field the role may not send is a KeyError or a
    TypeError here, not a refusal."""
    cls = CLASSES[role][body["kind"]]
    renamed = _RENAMED[cls]
    return cls(**{renamed.get(k, k): v for k, v in body.items() if k not in ENVELOPE})


def pick(msg: Message, names: tuple[str, ...]) -> dict[str, Any]:
    """Some of a message's fields by their names on the wire: what a journal record keeps of
    it, under the names the journal has always used. A name the class lacks is an error."""
    renamed = _RENAMED.get(type(msg), {})
    return {name: getattr(msg, renamed.get(name, name)) for name in names}
