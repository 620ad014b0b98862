"""A generation that stops without failing: the exit barrier and the idle guard, controller side.
Pure: the supervisor passes the clock in and does the I/O the returned actions ask for.

Exit barrier. torchrun waits for every rank, so a rank that hangs after its work (in a final
barrier, in a destructor, in a thread that never ends) keeps the job alive forever. Once one rank
of the generation has exited 0, the others get `exit_timeout_s` to exit, counted from that exit
(or from the latest step reported since); past it, the controller asks the agents still holding
live ranks for their stacks, records an `exit_hang` incident, kills the generation and finishes.
The deadline lives here, not in an agent, because the clean rank and the hung one may be on
different hosts.

Idle guard. Agents report when every live rank on their host has used ~no CPU and written no
output for a while (agent/idle.py) and when that stops. The job is idle when every host of the
generation says so; once the last of them has been idle for `idle_timeout_s`, the controller
asks every agent for stacks and the supervisor treats it as a hang.

Deadlock. The same reports carry `overdue` when a rank on that host is past its hang allowance
and every rank there has waited `confirm_s` together (agent/verdict.py). Once every host of the
generation is idle and one of them has an overdue rank, nobody computes what the others wait
for: after `confirm_s`, stacks, and a hang. A rank that waits while a peer computes is never
judged here: the computing peer's host is not idle.

Teardown. When the stacks of an idle job show every rank that answered in teardown
(destroy_process_group, interpreter exit), it is not restarted: its work is done, and the exit
barrier rules from then as if a rank had exited 0.

       ┌──────────────── watching ────────────────┐
       │ first rank exit 0 → barrier (deadline)     │ all agents idle ≥ timeout
       ▼                                           ▼
  barrier expired ──▶ collect stacks (bounded) ──▶ ExitHang  /  idle hang
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ftrun.agent.verdict import in_teardown
from ftrun.wire.inbound import Stacks

STACK_TEXT_MAX = 48 * 1024  # per rank, so a reply of 8 ranks stays well under a frame


def stacks_timeout_s(nproc_per_node: int) -> float:
    """How long an agent may take to answer for its ranks: each rank's faulthandler dump
    (about a second, all at once), then `py-spy dump` one rank after another (≤ 5 s each)."""
    return 10.0 + 5.0 * nproc_per_node


class Why(str, enum.Enum):
    EXIT_HANG = "exit_hang"
    IDLE = "idle"


@dataclass
class StackRequest:
    """Stacks asked of some agents; complete when all replied or the deadline passed."""

    why: Why
    waiting: set[str]
    deadline: float
    asked_t: float
    stacks: dict[str, str] = field(default_factory=dict)  # rank (as text) → stacks
    states: dict[str, str] = field(default_factory=dict)
    tails: dict[str, list[str]] = field(default_factory=dict)
    rank_agents: dict[int, str] = field(default_factory=dict)
    idle_ranks: dict[int, float] = field(default_factory=dict)  # IDLE: seconds idle when asked
    overdue: dict[int, float] = field(default_factory=dict)  # IDLE: rank → allowance passed
    asked_wall_t: float = 0.0

    def on_reply(self, agent_id: str, msg: Stacks) -> None:
        if agent_id not in self.waiting:
            return
        self.waiting.discard(agent_id)
        for rank, text in (msg.stacks or {}).items():
            self.stacks[str(rank)] = str(text)[:STACK_TEXT_MAX]
            self.rank_agents[int(rank)] = agent_id
        self.states.update({str(r): str(s) for r, s in (msg.states or {}).items()})
        self.tails.update({str(r): list(t)[-20:] for r, t in (msg.tails or {}).items()})

    def complete(self, now: float) -> bool:
        return not self.waiting or now >= self.deadline


@dataclass(frozen=True)
class AskStacks:
    """Action: send `capture_stacks` to these agents."""

    why: Why
    agents: frozenset[str]


@dataclass(frozen=True)
class ExitHang:
    """The generation's work is done (a rank exited 0) and these ranks did not exit in time."""

    clean_rank: int
    clean_host: str
    timeout_s: float
    waited_s: float
    hung: dict[int, str]  # rank → agent id
    stacks: dict[str, str]
    states: dict[str, str]
    tails: dict[str, list[str]]
    unanswered: frozenset[str]  # agents that did not send stacks in time
    teardown: bool = False  # the barrier started from stacks in teardown, not from an exit 0
    raced: bool = False  # ended early: every live rank stuck in torch's gloo exit deadlock


@dataclass(frozen=True)
class Teardown:
    """Every rank that answered was in teardown when the job went idle: finish, not restart."""

    rank: int
    agent: str
    ranks: list[int]


@dataclass(frozen=True)
class Idle:
    """Every rank on every host idle for the window: a hang without a progress signal."""

    idle_s: float
    ranks: dict[int, float]  # rank → seconds idle
    rank_agents: dict[int, str]
    stacks: dict[str, str]
    states: dict[str, str]
    tails: dict[str, list[str]]
    unanswered: frozenset[str]
    overdue: dict[int, float] = field(default_factory=dict)  # a deadlock: rank → allowance
    overdue_at: dict[int, float] = field(default_factory=dict)  # rank → allowance ran out (wall)
    detected_wall_t: float | None = None  # when every host was found idle (wall clock)


class StallWatch:
    """Exit barrier and idle guard of one generation."""

    def __init__(
        self,
        agents: set[str],
        *,
        exit_timeout_s: float,
        idle_timeout_s: float,
        stacks_timeout_s: float,
        confirm_s: float = 1.0,
    ) -> None:
        self.agents = set(agents)
        self.exit_timeout_s = exit_timeout_s
        self.idle_timeout_s = idle_timeout_s  # 0: the idle guard is off
        self.stacks_timeout_s = stacks_timeout_s
        self.confirm_s = confirm_s
        self.teardown = False  # the barrier runs because the stacks showed teardown
        self.raced: set[str] = set()  # agents whose every live rank is stuck at exit (gloo)
        self.clean: tuple[int, str] | None = None  # (rank, host) of the first exit 0
        self.clean_t: float | None = None
        self.deadline: float | None = None
        self.exited: set[str] = set()  # agents whose torchrun exited 0
        self.idle: dict[str, dict[int, float]] = {}  # agent → rank → idle since (our clock)
        self.overdue: dict[str, dict[int, float]] = {}  # agent → rank → allowance it is past
        self.overdue_at: dict[int, float] = {}  # rank → when its allowance ran out (wall clock)
        self.request: StackRequest | None = None

    # ---- events -----------------------------------------------------------------------------

    @property
    def finishing(self) -> bool:
        """A rank exited 0: the generation's work is done, whatever happens next."""
        return self.clean is not None

    def on_clean_exit(self, rank: int, host: str, now: float) -> bool:
        """A rank exited 0. True when it is the first: the barrier starts now."""
        if self.clean is not None:
            return False
        self.clean, self.clean_t = (rank, host), now
        self.deadline = now + self.exit_timeout_s
        if self.request is not None and self.request.why is Why.IDLE:
            self.request = None  # finishing: an idle job here is a job at its exit
        return True

    def on_teardown(self, rank: int, host: str, now: float) -> None:
        """The stacks showed teardown: the barrier starts now, as on a clean exit."""
        if self.on_clean_exit(rank, host, now):
            self.teardown = True

    def on_exit_race(self, agent_id: str, rank: int, host: str, now: float) -> bool:
        """Every live rank of this agent is stuck in torch's gloo deadlock at exit: their code
        is done. The barrier starts if it had not (as for teardown); once every agent that
        holds live ranks says so, it is due now, not after its full timeout. True when the
        barrier started here."""
        self.raced.add(agent_id)
        started = self.on_clean_exit(rank, host, now)
        if started:
            self.teardown = True
        if self.deadline is not None and self.agents - self.exited <= self.raced:
            self.deadline = min(self.deadline, now)
        return started

    def on_progress(self, now: float) -> None:
        """A step reported while finishing: the ranks still work; the barrier counts from now."""
        if self.deadline is not None and self.request is None:
            self.deadline = max(self.deadline, now + self.exit_timeout_s)

    def on_agent_done(self, agent_id: str) -> None:
        """This agent's torchrun exited 0: it holds no live rank."""
        self.exited.add(agent_id)
        self.idle.pop(agent_id, None)
        self.overdue.pop(agent_id, None)
        if self.request is not None:
            self.request.waiting.discard(agent_id)

    def on_idle(
        self,
        agent_id: str,
        ranks: dict[int, float] | None,
        now: float,
        overdue: dict[int, float] | None = None,
        overdue_at: dict[int, float] | None = None,
    ) -> None:
        """An agent's report: seconds each of its live ranks has been idle, or None (busy); and
        the ranks there past their hang allowance, if any."""
        if not ranks:
            self.idle.pop(agent_id, None)
            self.overdue.pop(agent_id, None)
        else:
            self.idle[agent_id] = {int(r): now - float(s) for r, s in ranks.items()}
            if overdue:
                self.overdue[agent_id] = {int(r): float(a) for r, a in overdue.items()}
                self.overdue_at.update({int(r): float(t) for r, t in (overdue_at or {}).items()})
            else:
                self.overdue.pop(agent_id, None)

    def on_stacks(self, agent_id: str, msg: Stacks) -> None:
        if self.request is not None:
            self.request.on_reply(agent_id, msg)

    # ---- time -------------------------------------------------------------------------------

    def suspected(self) -> bool:
        """A host has ranks past their hang allowance among its idle ranks."""
        return any(self.overdue.get(agent) for agent in self.agents - self.exited)

    def window_s(self) -> float:
        """How long every host must have been idle: confirm_s for a suspected deadlock, else
        the idle guard's timeout (0: off)."""
        return self.confirm_s if self.suspected() else self.idle_timeout_s

    def idle_since(self) -> float | None:
        """Since when every host has been idle (the latest of its ranks to go idle); None when
        a host is busy or has not said, or nothing would judge it."""
        live = self.agents - self.exited
        if not self.window_s() or self.finishing or not live or not live <= self.idle.keys():
            return None
        return max(since for agent in live for since in self.idle[agent].values())

    def wakeup(self) -> float | None:
        """When poll() next has something to do without any message (None: never)."""
        if self.request is not None:
            return self.request.deadline
        if self.deadline is not None:
            return self.deadline
        since = self.idle_since()
        return None if since is None else since + self.window_s()

    def poll(
        self, now: float, wall_t: float = 0.0
    ) -> AskStacks | ExitHang | Idle | Teardown | None:
        if self.request is not None:
            return self._collected(now) if self.request.complete(now) else None
        if self.deadline is not None and now >= self.deadline:
            live = frozenset(self.agents - self.exited)
            return self._ask(Why.EXIT_HANG, live, now)
        since = self.idle_since()
        if since is not None and now - since >= self.window_s():
            hosts = self.agents - self.exited
            overdue = {r: a for agent in hosts for r, a in self.overdue.get(agent, {}).items()}
            ask = self._ask(Why.IDLE, frozenset(hosts), now)
            assert self.request is not None
            self.request.overdue = overdue
            self.request.asked_wall_t = wall_t
            # Taken now: the stack dumps themselves are output, and make the ranks look busy.
            self.request.idle_ranks = {
                r: now - t for agent in ask.agents for r, t in self.idle[agent].items()
            }
            self.request.rank_agents = {r: agent for agent in ask.agents for r in self.idle[agent]}
            return ask
        return None

    def _ask(self, why: Why, agents: frozenset[str], now: float) -> AskStacks:
        self.request = StackRequest(why, set(agents), now + self.stacks_timeout_s, asked_t=now)
        return AskStacks(why, agents)

    def _collected(self, now: float) -> ExitHang | Idle | Teardown:
        req = self.request
        assert req is not None
        self.request = None
        if req.why is Why.EXIT_HANG:
            assert self.clean is not None and self.clean_t is not None
            self.deadline = None
            return ExitHang(
                clean_rank=self.clean[0],
                clean_host=self.clean[1],
                timeout_s=self.exit_timeout_s,
                waited_s=req.asked_t - self.clean_t,
                hung=dict(sorted(req.rank_agents.items())),
                stacks=req.stacks,
                states=req.states,
                tails=req.tails,
                unanswered=frozenset(req.waiting),
                teardown=self.teardown,
                raced=bool(self.raced) and self.agents - self.exited <= self.raced,
            )
        torn = _all_in_teardown(req.stacks)
        if torn:
            rank = torn[0]
            return Teardown(rank, req.rank_agents.get(rank, ""), torn)
        return Idle(
            idle_s=min(req.idle_ranks.values()),
            ranks=dict(sorted(req.idle_ranks.items())),
            rank_agents=req.rank_agents,
            stacks=req.stacks,
            states=req.states,
            tails=req.tails,
            unanswered=frozenset(req.waiting),
            overdue=dict(sorted(req.overdue.items())),
            overdue_at={r: self.overdue_at[r] for r in req.overdue if r in self.overdue_at},
            detected_wall_t=req.asked_wall_t or None,
        )


def _all_in_teardown(stacks: dict[str, str]) -> list[int]:
    """The ranks in teardown when every rank whose stacks could be read is (else [])."""
    read = {r: t for r, t in stacks.items() if not t.startswith("no stacks")}
    torn = in_teardown(read)
    return sorted(int(r) for r in torn) if torn and len(torn) == len(read) else []
