"""Hang suspicion: which ranks have gone without progress past their allowance. Pure; the caller
passes the clock in, so tests drive it without processes.

Being past the allowance is a suspicion, not a verdict: the verdict needs evidence of what the
ranks are doing (verdict.py). A rank's allowance is, in order:
  - inside a declared section (ftrun.section): the section's timeout (None: no limit);
  - before its first step, or before it has a step interval to go by: the start-up allowance,
    which applies only when progress is expected (the job reported steps before, or the user
    asked for it with --progress-regex or an explicit --startup-timeout);
  - afterwards, the *base* allowance max(floor, k × the median of its recent step intervals),
    widened to LEARNED_MARGIN × the longest gap between two of its steps so far: a periodic long
    interval (an evaluation every N steps, a checkpoint every M) is learned the first time it
    is seen, and allowed from then on.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

RECENT_INTERVALS = 16
# A gap between steps as long as the longest seen so far, and half as long again, is the job's
# own rhythm: jitter on a busy machine makes the next evaluation a little slower than the last.
LEARNED_MARGIN = 1.5


@dataclass(frozen=True, kw_only=True)
class HangPolicy:
    startup_timeout_s: float | None = 300.0
    floor_s: float = 2.0
    factor: float = 5.0
    # A rank that computes (uses CPU) without a step, past its allowance, is given at least this
    # long before it counts as spinning: the first evaluation or final save is not learned yet.
    busy_floor_s: float = 60.0
    # Past an allowance, how long every rank of the job must have waited together (no CPU, no
    # output) before that is a hang: nobody is computing what the others wait for.
    confirm_s: float = 1.0
    # The start-up allowance applies only when progress is expected: the user set it explicitly,
    # gave --progress-regex, or the job reported steps in an earlier generation.
    expect_progress: bool = False


@dataclass
class RankProgress:
    since: float  # last progress (or start) time
    step: int | None = None
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_INTERVALS))
    longest_gap_s: float = 0.0  # the longest wait between two of its steps so far
    section: str | None = None
    section_timeout_s: float | None = None


@dataclass(frozen=True)
class Overdue:
    rank: int
    step: int | None
    last_progress_t: float
    allowance_s: float
    section: str | None
    base_allowance_s: float | None = None  # before the learned rhythm widened it

    @property
    def deadline(self) -> float:
        return self.last_progress_t + self.allowance_s


class ProgressTracker:
    def __init__(self, policy: HangPolicy, *, expect_progress: bool) -> None:
        self.policy = policy
        self.expect_progress = expect_progress
        self.ranks: dict[int, RankProgress] = {}

    def on_start(self, rank: int, now: float) -> None:
        self.ranks.setdefault(rank, RankProgress(since=now))

    def on_step(self, rank: int, step: int, now: float) -> None:
        p = self.ranks.setdefault(rank, RankProgress(since=now))
        if p.step is not None and step > p.step:
            p.intervals.append((now - p.since) / (step - p.step))
            p.longest_gap_s = max(p.longest_gap_s, now - p.since)
        if p.step is None or step > p.step:
            p.step = step
            p.since = now

    def on_section(
        self, rank: int, name: str, timeout_s: float | None, begin: bool, now: float
    ) -> None:
        p = self.ranks.setdefault(rank, RankProgress(since=now))
        p.since = now  # entering or leaving a section is progress too
        p.section, p.section_timeout_s = (name, timeout_s) if begin else (None, None)

    def on_exit(self, rank: int) -> None:
        self.ranks.pop(rank, None)

    def base_allowance(self, p: RankProgress) -> float | None:
        """The allowance from the step rate alone (sections and start-up as allowance())."""
        if p.section is not None:
            return p.section_timeout_s
        if p.step is None or not p.intervals:
            return self.policy.startup_timeout_s if self.expect_progress else None
        return max(self.policy.floor_s, self.policy.factor * statistics.median(p.intervals))

    def allowance(self, p: RankProgress) -> float | None:
        base = self.base_allowance(p)
        if base is None or p.section is not None or not p.intervals:
            return base
        return max(base, LEARNED_MARGIN * p.longest_gap_s)

    def overdue(self, now: float, *, learned: bool = True) -> list[Overdue]:
        """Ranks past their allowance (`learned=False`: past the base allowance, which ignores
        the learned rhythm), the likeliest culprit first: the one that stopped earliest (the
        others usually stopped after it, waiting for it in a collective)."""
        late = []
        for rank, p in self.ranks.items():
            base = self.base_allowance(p)
            allowance = self.allowance(p) if learned else base
            if allowance is not None and now - p.since > allowance:
                late.append(Overdue(rank, p.step, p.since, allowance, p.section, base))
        return sorted(late, key=lambda o: (o.last_progress_t, o.rank))
