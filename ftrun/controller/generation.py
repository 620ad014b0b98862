"""One generation as the controller sees it while it runs: which agents and hosts, how far it
got, and what its agents' messages mean: output becomes journal events (log lines, first step,
progress, rank starts, every rank's exit), a rank's crash or hang becomes a Failure, every host's
torchrun exiting 0 is success. Clean rank exits (beyond their journal line), idle reports and stacks are the stall desk's (stalldesk.py).
And how a generation ends: an `Ending`, decided before the supervisor tears it down.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ftrun.controller import evidence
from ftrun.controller.evidence import Evidence, Failure
from ftrun.controller.preemption import Preempted
from ftrun.controller.reporting import JobOutcome, OutcomeState, Reporter
from ftrun.controller.roster import Roster
from ftrun.controller.shm_notes import tier_note
from ftrun.controller.stall import ExitHang, StallWatch
from ftrun.journal import Journal
from ftrun.wire.inbound import (
    CheckpointCommitted,
    CheckpointRestored,
    CheckpointTier,
    GenExited,
    Log,
    PeerFetched,
    Progress,
    RankExited,
    RankHung,
    RankStarted,
    Report,
    Signalled,
    pick,
)

# How often the journal takes the job's step while it trains: the resolution of the step rate in
# `inspect --html` and of goodput's account of a generation's last seconds (a line a second is
# ~3 MiB over ten hours).
PROGRESS_EVENT_INTERVAL_S = 1.0

# What the journal keeps of a rank's exit; of a failing one also its evidence.
EXIT_FIELDS = ("rank", "pid", "exit_code", "signal", "t_exit", "step")
EXIT_EVIDENCE = ("exception", "traceback", "traceback_source")
PEER_FETCHED_FIELDS = ("source", "which", "ranks", "snapshots", "bytes", "seconds", "error")
TIER_FIELDS = ("rank", "tier", "from", "why", "need", "free", "total")


class Seen(enum.Enum):
    """A message the watch took that decides nothing by itself."""

    OUTPUT = "output"  # logs, rank starts, signal deliveries: journaled and shown
    PROGRESS = "progress"  # a step: the job may grow now (the caller checks)


@dataclass
class GenWatch:
    number: int
    agents: set[str]
    hosts: dict[str, str]  # agent id → host
    order: list[str]  # agent ids by node rank
    stall: StallWatch  # exit barrier and idle guard
    journal: Journal
    reporter: Reporter
    done: set[str] = field(default_factory=set)
    max_step: int | None = None
    first_step_seen: bool = False
    last_progress_event: float = 0.0
    last_commit_event: float = 0.0
    ranks_started: int = 0  # for what a slow first step is waiting on
    rank_lines: int = 0  # lines the ranks printed: a script at work that reports no step
    clean_ranks: set[int] = field(default_factory=set)  # the ranks that exited 0
    steps_hint_given: bool = False
    stall_s: float | None = None  # rank 0's time blocked on checkpoints so far (goodput)
    restored: bool = False  # the generation's restore is journaled (once)
    restored_step: int | None = None  # the step its ranks restored (rank 0 reports it)
    injected: dict[str, Any] | None = None
    nproc_per_node: int = 0  # ranks per host, numbered by node rank; 0: not checked
    # Taken over by a resumed controller (adoption.py): its first progress here is the first
    # step again, which closes the controller-lost incident.
    adopted: bool = False
    # agent id → its node rank; forged() runs on every message, so not order.index each time.
    node_rank: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.node_rank = {agent_id: i for i, agent_id in enumerate(self.order)}

    def every_rank_exited_0(self) -> bool:
        """The generation's work is done and none of its ranks runs: it has succeeded, without
        waiting for each host's torchrun to leave its own exit barrier (which waits up to 300 s
        for a host that was lost after its ranks exited 0)."""
        world = len(self.order) * self.nproc_per_node
        return bool(world) and len(self.clean_ranks) >= world

    def agent_done(self, agent_id: str) -> bool:
        """This agent holds no live rank any more (its torchrun exited 0, or it was lost after
        its ranks did). True when that was the last one: the generation succeeded."""
        self.done.add(agent_id)
        self.stall.on_agent_done(agent_id)
        return self.done >= self.agents

    def finished_on(self, agent_id: str) -> bool:
        """Every rank of this agent's host exited 0: losing the host now loses no work (a
        Slurm node released, a spot machine reclaimed, as the job ends)."""
        if not self.nproc_per_node or agent_id not in self.node_rank:
            return False
        first = self.node_rank[agent_id] * self.nproc_per_node
        return all(r in self.clean_ranks for r in range(first, first + self.nproc_per_node))

    def forged(self, agent_id: str, msg: Report) -> str | None:
        """Why this message of the generation is not its sender's to send; None if it is. An
        agent speaks for its own host's ranks only: a holder of the job's keys must not report
        another host's rank as crashed (messages.py has already checked every field's shape)."""
        if agent_id not in self.agents:
            return f"{agent_id} has no part in generation {self.number}"
        if not self.nproc_per_node:
            return None
        first = self.node_rank[agent_id] * self.nproc_per_node
        mine = range(first, first + self.nproc_per_node)
        strays = sorted({r for r in _claimed_ranks(msg) if r not in mine})
        if strays:
            return (
                f"{agent_id} runs ranks {first}..{mine[-1]} but spoke for rank(s) "
                f"{', '.join(map(str, strays[:8]))}"
            )
        return None

    def on_message(self, agent_id: str, msg: Report) -> Seen | Failure | OutcomeState | None:
        """A message of this generation from one of its agents: output (Seen), a Failure, or
        SUCCEEDED once every host's torchrun exited 0. None: not the watch's to judge (the
        stall desk's: clean rank exits, late hang reports, idle reports, stacks)."""
        host = self.hosts.get(agent_id, "?")
        if self.record_output(host, msg):
            if not isinstance(msg, Progress):
                return Seen.OUTPUT
            self.stall.on_progress(time.monotonic())
            return Seen.PROGRESS
        if isinstance(msg, (RankExited, RankHung)) and msg.step is not None:
            self.max_step = max(self.max_step or 0, msg.step)
        match msg:
            case RankExited():  # every exit, 0 too: `ftrun status JOB` lists each rank's
                failed = msg.exit_code != 0 or bool(msg.signal)
                fields = EXIT_FIELDS + (EXIT_EVIDENCE if failed else ())
                self.journal.record("rank_exited", gen=self.number, host=host, **pick(msg, fields))
                if failed:
                    return evidence.crash(msg, host, self.max_step)
                self.clean_ranks.add(msg.rank)
            case RankHung() if not self.stall.finishing:
                return evidence.hang(msg, host, self.max_step)
            case GenExited():
                if msg.exit_code != 0:
                    return evidence.torchrun_exit(msg, host, self.max_step, time.time())
                return OutcomeState.SUCCEEDED if self.agent_done(agent_id) else Seen.OUTPUT
        return None

    def record_output(self, host: str, msg: Report) -> bool:
        """Logs, progress, signal deliveries and rank starts (also while the generation is torn
        down); True when the message was one of those."""
        journal = self.journal
        match msg:
            case Log():
                self._log(host, msg)
                return True
            case Progress():
                self._progress(host, msg)
                return True
            case CheckpointCommitted() if msg.rank == 0:
                now = time.monotonic()
                if now - self.last_commit_event >= PROGRESS_EVENT_INTERVAL_S:  # per step: many
                    journal.record("checkpoint_committed", gen=self.number, step=msg.step)
                    self.last_commit_event = now
                return False  # a preemption wait also reads it
            case PeerFetched():  # the snapshots of ranks this host took over (peercopy)
                fields = pick(msg, PEER_FETCHED_FIELDS)
                journal.record("peer_fetched", gen=self.number, host=host, **fields)
                return True
            case CheckpointRestored() if not self.restored:
                self.restored = True  # every rank restores the same step; rank 0 tells
                self.restored_step = msg.step
                journal.record(
                    "checkpoint_restored",
                    gen=self.number,
                    step=msg.step,
                    tier=msg.tier,
                    restore_s=msg.restore_s,
                    # the candidates skipped before it, and why (a failed check, a rejected step)
                    **({"skipped": msg.skipped} if msg.skipped else {}),
                )
                return True
            case CheckpointTier():  # a rank's memory tier stepped down: once per rank
                fields = pick(msg, TIER_FIELDS)
                journal.record("checkpoint_tier", gen=self.number, host=host, **fields)
                self.reporter.notice(tier_note(host, msg), level="warning")
                return True
            case Signalled():
                journal.record(
                    "signal_delivered",
                    gen=self.number,
                    host=host,
                    signal=msg.signal,
                    ranks=msg.ranks,
                )
                return True
            case RankStarted():
                self.ranks_started += 1
                journal.record(
                    "rank_started", gen=self.number, host=host, rank=msg.rank, pid=msg.pid
                )
                return True
        return False

    def _log(self, host: str, msg: Log) -> None:
        lines = msg.lines or []
        if msg.rank is None:
            self.journal.append_log(self.number, f"{host}.torchrun", lines)
            self.reporter.torchrun_output(host, lines)
        else:
            self.journal.append_log(self.number, f"rank{msg.rank}", lines)
            self.reporter.rank_output(msg.rank, lines)
            self.rank_lines += len(lines)

    def _progress(self, host: str, msg: Progress) -> None:
        step = msg.step
        if step is not None:
            self.max_step = step if self.max_step is None else max(self.max_step, step)
        if msg.stall_s is not None:
            self.stall_s = msg.stall_s
        now = time.monotonic()
        if (msg.first or self.adopted) and not self.first_step_seen:
            self.first_step_seen = True
            self.journal.record(
                "first_step", gen=self.number, host=host, rank=msg.rank, step=step, rank_t=msg.t
            )
            self.last_progress_event = now
        elif now - self.last_progress_event >= PROGRESS_EVENT_INTERVAL_S:
            extra = {} if self.stall_s is None else {"stall_s": self.stall_s}
            self.journal.record("progress", gen=self.number, step=self.max_step, **extra)
            self.last_progress_event = now

    def no_step_yet(self, waited: float) -> str | None:
        """What a generation slow to its first step is doing, for the person waiting. Ranks that
        print but report no step are most likely a script that never reports one (one written
        for torchrun): that is said once, with how to give ftrun steps, rather than "still
        starting" at every note of a run that trains for hours."""
        started = self.ranks_started
        if self.rank_lines and started:
            if self.steps_hint_given:
                return None
            self.steps_hint_given = True
            return (
                f"generation {self.number}: no step reported after {waited:.0f} s, while its "
                f"{started} rank(s) print output: the script may not report steps, so hangs are "
                "judged by CPU and output. For steps (steps lost, step rates, a hang caught "
                "within the step allowance) call ftrun.step(n) each step, or give "
                "--progress-regex for a line it prints each step"
            )
        ranks = f"{started} rank(s) started" if started else "no rank started yet"
        return (
            f"generation {self.number}: no step yet after {waited:.0f} s ({ranks}; "
            "rendezvous, imports or a restore are still running)"
        )

    def reconfiguration(
        self, roster: Roster, excluded: Callable[[str], bool]
    ) -> Reconfigure | None:
        """A host of this generation was removed, or ready hosts can grow a shrunken job. Grow
        only once this generation steps (its start-up is paid; no flapping while it starts)."""
        if self.stall.finishing:
            return None  # its work is done: it ends, whatever the hosts do
        removed = roster.needs_replacing()
        if removed:
            return Reconfigure("remove", f"{', '.join(removed)} removed from the job")
        if not self.first_step_seen:
            return None
        joining = roster.can_grow(excluded=excluded)
        if joining:
            return Reconfigure(
                "grow", f"{', '.join(joining)} ready: growing from {len(self.agents)} host(s)"
            )
        return None

    def root_cause(self, failure: Failure) -> dict[str, Any]:
        """What `status` and `inspect` show as why the job failed."""
        ev: Evidence = failure.evidence
        stream = f"rank{ev.rank}" if ev.rank is not None else f"{ev.host}.torchrun"
        return {
            "kind": ev.kind,
            "host": ev.host,
            "rank": ev.rank,
            "exit_code": ev.exit_code,
            "signal": ev.signal,
            "exception": ev.exception,
            "generation": self.number,
            "traceback": failure.detail.get("traceback"),
            "traceback_source": failure.detail.get("traceback_source"),
            "tail": (failure.detail.get("tail") or [])[-15:],
            "log": str(self.journal.log_path(self.number, stream)),
        }


def _claimed_ranks(msg: Report) -> list[int]:
    """Every rank a message speaks for: `rank`, lists of ranks, and maps keyed by rank. A
    `peer_fetched` report's ranks are whose snapshots the agent fetched, which are another
    host's old ranks when it joined a re-planned job (peercopy/fetch.py): it speaks for none."""
    if isinstance(msg, PeerFetched):
        return []
    claimed: list[int] = []
    if isinstance(rank := getattr(msg, "rank", None), int):
        claimed.append(rank)
    for name in RANK_FIELDS:
        value = getattr(msg, name, None)
        if isinstance(value, list):
            claimed += [r for r in value if isinstance(r, int)]
        elif isinstance(value, dict):
            claimed += [int(k) for k in value if str(k).isdigit()]
    return claimed


# The fields that name ranks, in whichever report has them: a list of ranks, or a map by rank.
RANK_FIELDS = ("ranks", "overdue", "stacks", "states", "tails")


@dataclass
class Reconfigure:
    """A planned new generation (not a fault): grow onto ready hosts, or drop a removed one."""

    why: str  # grow | remove
    detail: str


# What ends a watch: every host done (SUCCEEDED), a stop (STOPPED), a fault, a planned change
# of hosts, or ranks that did not exit after one exited 0.
WatchResult = OutcomeState | Failure | Reconfigure | ExitHang | Preempted


@dataclass(frozen=True)
class Ending:
    """How a generation ends, decided before the supervisor tears it down (the one way)."""

    outcome: str  # as generation_ended says: succeeded|stopped|exit_hang|reconfigured|failed
    graceful: bool | None  # ranks get SIGTERM and the grace period; None: nothing to tear down
    incident: int | None = None  # the incident it ends (journals torn_down)
    job: JobOutcome | None = None  # the job ends with this; None: a next generation
    notice: tuple[str, str] | None = None  # (text, level), told once the generation has ended
    why: str = ""  # what the next generation is for
    failure: Failure | None = None  # the fault a restart follows
