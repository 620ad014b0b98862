"""The ranks of a job's current generation, from the journal: where each runs and what became of it.

`ftrun status JOB` lists them, so that a person can find one rank's process (`kill -USR1 PID`)
without `ps` on every host. The controller journals `rank_started` (host, rank, pid: the rank's
own process, the one that runs the script) and `rank_exited` (exit code or signal) as the agents
report them. A rank with no exit journaled is running while its generation runs; after that:

    the generation succeeded      → exited 0 (every host's torchrun exited 0; older journals
                                    journaled only the failing exits)
    it ended otherwise            → killed (torn down with its generation)
    the job ended without ending it (its controller died) → unknown

Pure: events in, RankView out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

RANK_STATES = ("running", "exited", "killed", "unknown")


@dataclass
class RankView:
    rank: int
    host: str | None
    local_rank: int | None
    pid: int | None
    state: str  # one of RANK_STATES
    exit_code: int | None = None
    signal: str | None = None  # the signal that killed it, as the agent named it (SIGKILL)
    why: str | None = None  # for killed and unknown without a signal: what the journal says

    @property
    def state_text(self) -> str:
        """`running`, `exited 0`, `killed SIGKILL`, `killed (torn down …)`, `unknown (…)`."""
        if self.state == "exited":
            return f"exited {self.exit_code}"
        if self.signal is not None:
            return f"{self.state} {self.signal}"
        return self.state + (f" ({self.why})" if self.why else "")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def fold_ranks(events: list[dict[str, Any]], *, job_running: bool) -> list[RankView]:
    """The ranks of the last generation launched, by rank. `job_running`: the controller runs
    (a rank without an exit is running only then)."""
    fold = RanksFold()
    for ev in events:
        fold.feed(ev)
    return fold.ranks(job_running=job_running)


@dataclass
class RanksFold:
    """fold_ranks one event at a time: the last generation's ranks as the journal tells them."""

    gen: int | None = None
    hosts: list[str] = field(default_factory=list)
    world: int = 0
    by_rank: dict[int, RankView] = field(default_factory=dict)
    outcome: str | None = None
    ended: bool = False

    def feed(self, ev: dict[str, Any]) -> None:
        kind, g = ev["kind"], ev.get("gen")
        if kind == "generation_launched" and _int(g):
            self.gen, self.by_rank, self.ended, self.outcome = g, {}, False, None
            self.hosts = [h for h in ev.get("hosts") or [] if isinstance(h, str)]
            self.world = ev.get("world_size") or 0
        elif g != self.gen or self.gen is None:
            return
        elif kind == "rank_started" and _int(ev.get("rank")):
            rank = ev["rank"]
            pid = ev.get("pid") if _int(ev.get("pid")) else None
            local = _local(rank, self.world, self.hosts)
            self.by_rank[rank] = RankView(rank, ev.get("host"), local, pid, "running")
        elif kind == "rank_exited" and _int(ev.get("rank")):
            r = self.by_rank.get(ev["rank"])
            if r is None:  # a journal that lost the start: what the exit says
                local = _local(ev["rank"], self.world, self.hosts)
                r = self.by_rank[ev["rank"]] = RankView(
                    ev["rank"], ev.get("host"), local, None, "running"
                )
            if r.pid is None and _int(ev.get("pid")):
                r.pid = ev["pid"]
            sig, code = ev.get("signal"), ev.get("exit_code")
            r.signal = sig if isinstance(sig, str) and sig else None
            r.exit_code = code if _int(code) else None
            r.state = "killed" if r.signal is not None else "exited"
        elif kind == "generation_ended":
            self.ended, self.outcome = True, ev.get("outcome")

    def ranks(self, *, job_running: bool) -> list[RankView]:
        """The ranks by number, as of now (copies: the fold goes on)."""
        out = [replace(self.by_rank[k]) for k in sorted(self.by_rank)]
        for r in out:
            if r.state != "running":
                continue
            if self.ended and self.outcome == "succeeded":
                r.state, r.exit_code = "exited", 0
            elif self.ended:
                r.state, r.why = "killed", f"torn down, generation {self.outcome or 'ended'}"
            elif not job_running:
                r.state, r.why = "unknown", "the job ended without ending its generation"
        return out

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["by_rank"] = [asdict(r) for r in self.by_rank.values()]
        return out

    @classmethod
    def from_json(cls, state: dict[str, Any]) -> RanksFold:
        fold = cls(**{**state, "by_rank": {}})
        fold.by_rank = {r["rank"]: RankView(**r) for r in state["by_rank"]}
        return fold


def _local(rank: int, world: int, hosts: list[str]) -> int | None:
    """Node ranks take consecutive blocks of ranks, `world / hosts` each."""
    if not hosts or world <= 0 or world % len(hosts):
        return None
    return rank % (world // len(hosts))


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
