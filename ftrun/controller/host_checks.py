"""Checks of each host before it runs ranks: the same Python and torch as the others, and a clock
that agrees with this machine's.

A host with another torch (or Python minor version) than the job's other hosts fails at the
rendezvous at best, and at worst trains on with kernels that differ; a host whose clock is off
dates its faults wrongly in the journal. Each agent's hello says what the ranks there run and
its wall clock (agent/host_facts.py). Once the first agents have all said hello (`settle`), the
versions most hosts have are the job's; a host with others is left out of every plan (the job
machine's `leave_out`), with one line saying why and what to do; if its agent comes back with
the job's versions (`ftrun hosts JOB add HOST` after fixing it), it is let in again. A clock
more than MAX_SKEW_S off is said, not acted on. (Free /dev/shm against the memory tier's need
is shm_notes.py's note.)
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from ftrun.controller.reporting import Reporter
from ftrun.journal import Journal
from ftrun.wire.inbound import Hello

MAX_SKEW_S = 2.0

Versions = tuple[str | None, str | None]  # (Python major.minor, torch)


def versions(msg: Hello) -> Versions:
    python = ".".join(msg.python.split(".")[:2]) if msg.python else None
    return python, msg.torch


def describe(v: Versions) -> str:
    return f"Python {v[0] or '?'}, torch {v[1] or 'not installed'}"


class HostChecks:
    def __init__(
        self,
        *,
        journal: Journal,
        reporter: Reporter,
        leave_out: Callable[[str, str], None],
        let_in: Callable[[str], None],
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.journal, self.reporter, self.wall = journal, reporter, wall
        self.leave_out, self.let_in = leave_out, let_in
        self.seen: dict[str, Versions] = {}
        self.job: Versions | None = None  # the job's versions, once settled
        self.out: set[str] = set()
        self.skew_said: set[str] = set()

    def heard(self, host: str, msg: Hello) -> None:
        """A host's agent said hello (a first one, a restarted one, one added)."""
        if msg.python is None and msg.torch is None:
            return  # an agent of an older ftrun: nothing to check
        self.seen[host] = versions(msg)
        if msg.wall_t is not None:
            skew = msg.wall_t - self.wall()
            if abs(skew) > MAX_SKEW_S and host not in self.skew_said:
                self.skew_said.add(host)
                self.journal.record("clock_skew", host=host, skew_s=round(skew, 3))
                way = "ahead of" if skew > 0 else "behind"
                self.reporter.notice(
                    f"{host}'s clock is {abs(skew):.1f} s {way} this machine's: the times its "
                    "agent reports are off by as much (run NTP or chrony there)",
                    level="warning",
                )
        if self.job is not None:
            self._judge(host)

    def settle(self) -> None:
        """The first agents are all in: the versions most of them have are the job's (ties: the
        first host's), and each host is judged against them."""
        if not self.seen or self.job is not None:
            return
        counts = Counter(self.seen.values())
        first = next(iter(self.seen.values()))
        self.job = max(counts, key=lambda v: (counts[v], v == first))
        for host in list(self.seen):
            self._judge(host)

    def _judge(self, host: str) -> None:
        assert self.job is not None
        mine = self.seen[host]
        if mine == self.job:
            if host in self.out:
                self.out.discard(host)
                self.let_in(host)
                self.reporter.notice(f"{host} now has {describe(mine)}, as the job: let in again")
            return
        if host in self.out:
            return
        self.out.add(host)
        why = f"{host} has {describe(mine)}; the job's other hosts have {describe(self.job)}"
        self.leave_out(host, why)
        self.reporter.notice(
            f"{why}: left out. Install the same versions there, then `ftrun hosts JOB add {host}`",
            level="warning",
        )
