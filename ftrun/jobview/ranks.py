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

from dataclasses import asdict, dataclass
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
    gen: int | None = None
    hosts: list[str] = []
    world = 0
    ranks: dict[int, RankView] = {}
    outcome: str | None = None
    ended = False
    for ev in events:
        kind, g = ev["kind"], ev.get("gen")
        if kind == "generation_launched" and _int(g):
            gen, ranks, ended, outcome = g, {}, False, None
            hosts = [h for h in ev.get("hosts") or [] if isinstance(h, str)]
            world = ev.get("world_size") or 0
        elif g != gen or gen is None:
            continue
        elif kind == "rank_started" and _int(ev.get("rank")):
            rank = ev["rank"]
            pid = ev.get("pid") if _int(ev.get("pid")) else None
            ranks[rank] = RankView(rank, ev.get("host"), _local(rank, world, hosts), pid, "running")
        elif kind == "rank_exited" and _int(ev.get("rank")):
            r = ranks.get(ev["rank"])
            if r is None:  # a journal that lost the start: what the exit says
                r = ranks[ev["rank"]] = RankView(
                    ev["rank"], ev.get("host"), _local(ev["rank"], world, hosts), None, "running"
                )
            if r.pid is None and _int(ev.get("pid")):
                r.pid = ev["pid"]
            sig, code = ev.get("signal"), ev.get("exit_code")
            r.signal = sig if isinstance(sig, str) and sig else None
            r.exit_code = code if _int(code) else None
            r.state = "killed" if r.signal is not None else "exited"
        elif kind == "generation_ended":
            ended, outcome = True, ev.get("outcome")
    for r in ranks.values():
        if r.state != "running":
            continue
        if ended and outcome == "succeeded":
            r.state, r.exit_code = "exited", 0
        elif ended:
            r.state, r.why = "killed", f"torn down, generation {outcome or 'ended'}"
        elif not job_running:
            r.state, r.why = "unknown", "the job ended without ending its generation"
    return [ranks[k] for k in sorted(ranks)]


def _local(rank: int, world: int, hosts: list[str]) -> int | None:
    """Node ranks take consecutive blocks of ranks, `world / hosts` each."""
    if not hosts or world <= 0 or world % len(hosts):
        return None
    return rank % (world // len(hosts))


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
