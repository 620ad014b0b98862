"""Stragglers named, with evidence: each host's compute time per step against the others'.

Every agent reports its ranks' pace (agent/pace.py): of each window of steps (≥ 1 s), the time a
rank computed in its median step, its waits in collectives left out (and uneven work: an
evaluation on one rank every few steps moves no median). Here the generation's hosts are
compared (its ranks, when it has one host): a unit's figure is the median of its ranks' latest
windows; once every unit has a fresh one (a round), each is divided by the median of all (with
two hosts: by the other's), its ratio.

The verdict weighs evidence, so that a host twice as slow is named sooner than one 1.3 x slow,
and neither on one round: a unit's rounds in a row at ≥ RATIO are a streak, and it is named a
straggler once its streak is at least MIN_ROUNDS long and the streak's ratios multiply to at
least EVIDENCE (RATIO ** 3: three rounds at 1.3 x, two at 1.48 x or more). One round below RATIO
ends the streak. Named: journaled (`straggler`, with its figures), said once, and reported only
(the default policy; docs/policy.md, *Stragglers*). One that then runs at the others' pace for
ROUNDS rounds in a row is journaled as recovered. A round is journaled (`pace`) when some unit
not yet named is in a streak (the evidence a verdict stands on) or gets a verdict, and otherwise
one in JOURNAL_EVERY (rounds are about a second now): `inspect` and the metrics show each
host's latest figure.

Why the median, and streaks: a healthy job's figures differ by a few percent and a loaded
machine slows every rank alike, so the median moves with them; one round's outlier is noise,
a streak whose ratios multiply past RATIO ** 3 is a host.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ftrun.controller.reporting import Reporter
from ftrun.journal import Journal
from ftrun.wire.inbound import PaceReport, Report

if TYPE_CHECKING:
    from ftrun.controller.generation import Reconfigure, WatchResult

RATIO = 1.3  # a round counts against a unit at this ratio to the median or more
MIN_ROUNDS = 2  # never named on one round
EVIDENCE = RATIO**3  # the streak's ratios multiplied, to be named
ROUNDS = 3  # rounds in a row at the others' pace, once named, to be recovered
JOURNAL_EVERY = 5  # a round with no unit at ≥ RATIO is journaled one in this many


@dataclass(frozen=True)
class Verdict:
    unit: str  # a host, or "rank N" in a one-host job
    named: bool  # True: named a straggler; False: recovered
    compute_s: float
    median_s: float
    step: int
    rounds: int

    @property
    def ratio(self) -> float:
        return self.compute_s / self.median_s if self.median_s > 0 else float("inf")


@dataclass
class PaceBoard:
    """The pure part: figures in, rounds and verdicts out."""

    units: list[str]  # what is compared: the generation's hosts, or its ranks ("rank N")
    latest: dict[str, float] = field(default_factory=dict)  # fresh since the last round
    slow: dict[str, list[float]] = field(default_factory=dict)  # a streak's ratios, not named
    fast: dict[str, int] = field(default_factory=dict)  # the named: rounds in a row back
    named: set[str] = field(default_factory=set)
    rounds: int = 0

    def add(self, unit: str, compute_s: float, step: int) -> tuple[dict[str, float], list[Verdict]]:
        """A unit's fresh figure; when it completes a round, its verdicts, and its figures when
        the round is to be journaled (a streak on, a verdict, or one in JOURNAL_EVERY)."""
        if unit not in self.units or len(self.units) < 2:
            return {}, []
        self.latest[unit] = compute_s
        if set(self.latest) != set(self.units):
            return {}, []
        figures, self.latest = self.latest, {}
        verdicts = self._judge(figures, step)
        self.rounds += 1
        # Every round of a streak is journaled: the evidence a verdict, given or not, stood on.
        if self.slow or verdicts or self.rounds % JOURNAL_EVERY == 1:
            return figures, verdicts
        return {}, verdicts

    def _judge(self, figures: dict[str, float], step: int) -> list[Verdict]:
        verdicts = []
        median = statistics.median(figures.values())
        for name, value in figures.items():
            # Two units: each against the other; more: against the median of all (with three,
            # the others' median is the mean of two, which one fast rank drags down).
            others = (
                next(v for u, v in figures.items() if u != name) if len(figures) == 2 else median
            )
            if name in self.named:  # named: only whether it is back at the others' pace
                back = others > 0 and value < RATIO * others
                self.fast[name] = self.fast.get(name, 0) + 1 if back else 0
                if self.fast[name] == ROUNDS:
                    self.named.discard(name)
                    del self.fast[name]
                    verdicts.append(Verdict(name, False, value, others, step, ROUNDS))
            elif others > 0 and value >= RATIO * others:
                streak = self.slow.setdefault(name, [])
                streak.append(value / others)
                if named_by(streak):
                    del self.slow[name]
                    self.named.add(name)
                    verdicts.append(Verdict(name, True, value, others, step, len(streak)))
            else:
                self.slow.pop(name, None)  # one round at the others' pace ends the streak
        return verdicts


def named_by(streak: list[float]) -> bool:
    """Whether a streak of rounds at ≥ RATIO (each one's ratio) names its unit a straggler."""
    # (A hair under EVIDENCE: three rounds at exactly RATIO multiply to it, rounding aside.)
    return len(streak) >= MIN_ROUNDS and math.prod(streak) >= EVIDENCE * (1 - 1e-9)


class StragglerWatch:
    """One generation's straggler watch: a waiter of the watch (waiters.py) that never ends it
    (report only); fed each `pace` message."""

    def __init__(
        self,
        gen: int,
        hosts: Mapping[str, str],
        *,
        nproc_per_node: int,
        journal: Journal,
        reporter: Reporter,
        decide: Callable[[str, float, list[str]], Reconfigure | None] = lambda *a: None,
    ) -> None:
        self.gen, self.hosts = gen, dict(hosts)  # agent id → host
        self.journal, self.reporter = journal, reporter
        # What to do about a host named (the job machine's on_straggler): None, report only.
        self.decide = decide
        self.change: Reconfigure | None = None
        self.by_host = len(set(self.hosts.values())) >= 2
        if self.by_host:
            units = sorted(set(self.hosts.values()))
        else:  # one host: its ranks are compared
            units = [f"rank {r}" for r in range(nproc_per_node)] if nproc_per_node >= 2 else []
        self.board = PaceBoard(units)
        self.figures: dict[str, dict[int, float]] = {}  # host → rank → compute_s (latest)

    def wake_at(self) -> float | None:
        return None  # only messages matter

    def expired(self, now: float) -> WatchResult | None:
        return None

    def on_message(self, agent_id: str, msg: Report) -> WatchResult | None:
        if isinstance(msg, PaceReport):
            ranks = {int(r): (int(v[0]), float(v[3])) for r, v in msg.ranks.items() if len(v) == 4}
            self.on_pace(agent_id, ranks)
        change = self.change  # a straggler replaced or dropped: the watch ends, planned
        self.change = None
        return change

    def on_pace(self, agent_id: str, ranks: Mapping[int, tuple[int, float]]) -> None:
        """An agent's ranks' latest windows: rank → (step, compute_s)."""
        host = self.hosts.get(agent_id)
        if host is None or not ranks:
            return
        mine = self.figures.setdefault(host, {})
        step = max(s for s, _ in ranks.values())
        for rank, (_, compute_s) in ranks.items():
            mine[rank] = compute_s
        if self.by_host:
            self._fold(self.board.add(host, statistics.median(mine.values()), step), "host", step)
            return
        for rank, (_, compute_s) in sorted(ranks.items()):
            self._fold(self.board.add(f"rank {rank}", compute_s, step), "rank", step)

    def _fold(self, result: tuple[dict[str, float], list[Verdict]], unit: str, step: int) -> None:
        figures, verdicts = result
        if figures:
            self.journal.record("pace", gen=self.gen, unit=unit, step=step, compute_s=figures)
        for v in verdicts:
            fields = dict(gen=self.gen, unit=v.unit, compute_s=v.compute_s,
                          median_s=v.median_s, ratio=round(v.ratio, 2), step=v.step,
                          rounds=v.rounds)  # fmt: skip
            if v.named:
                self.journal.record("straggler", **fields)
                if self.by_host and self.change is None:
                    self.change = self.decide(v.unit, v.ratio, sorted(set(self.hosts.values())))
                then = self.change.detail if self.change else "reported only"
                self.reporter.notice(
                    f"{v.unit} is a straggler: {v.compute_s:.3g} s of compute a step against "
                    f"{v.median_s:.3g} s on the others ({v.ratio:.1f}x) for {v.rounds} windows "
                    f"in a row; {then} (docs/policy.md, Stragglers)",
                    level="warning",
                )
            else:
                self.journal.record("straggler_recovered", **fields)
                self.reporter.notice(f"{v.unit} is back at the others' pace")
