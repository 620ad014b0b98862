"""Which hosts the job has, in what state, and which of them the next generation runs on. Pure.

    STARTING ──hello──▶ READY ──planned──▶ ACTIVE
       ▲   └─unreachable─┐  ▲  └──────────────┤ (not planned: back to READY, a spare)
       │                 ▼  └──────────────── │
       └──── retry ───  LOST ◀──agent lost────┘
    REMOVED ◀── `ftrun hosts JOB remove` (from any state);  `add` ──▶ STARTING

The job wants `want` hosts: --max-nodes, else as many as it was launched with (torchrun's MAX in
--nnodes MIN:MAX).
`ftrun hosts add/remove` change the pool, not the want: an added host fills a shrunken job or
waits as a spare; a removed one is replaced like a lost one. A plan keeps the hosts of the last generation that are still good, in their order (node rank 0
stays where it was unless it is gone), then fills up from ready hosts, spares first as listed,
hosts lost since the last plan (and back already) last.
Fewer than `min_nodes` good hosts: no plan (the caller makes that fatal).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ftrun.errors import FtrunError


class HostState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    ACTIVE = "active"
    LOST = "lost"
    REMOVED = "removed"


_USABLE = (HostState.READY, HostState.ACTIVE)


@dataclass
class HostSlot:
    host: str
    state: HostState = HostState.STARTING
    agent_id: str | None = None
    incarnation: int = 0


class NotEnoughHosts(FtrunError):
    """Fewer usable hosts than --min-nodes: no generation can be planned."""

    def __init__(self, usable: list[str], min_nodes: int) -> None:
        super().__init__(
            f"{len(usable)} usable host(s), fewer than --min-nodes {min_nodes}",
            hint="check the unreachable hosts, add --spares, or lower --min-nodes",
            data={"usable": usable, "min_nodes": min_nodes},
        )
        self.usable = usable
        self.min_nodes = min_nodes

    def explain(self, why: str) -> str:
        """The reason a job ends with: `why` a new generation was wanted, and why there is none."""
        left = ", ".join(self.usable) or "none"
        return (
            f"{why}, and no spare host is ready to take its place: {len(self.usable)} "
            f"usable host(s) ({left}), fewer than --min-nodes {self.min_nodes}"
        )


class Roster:
    def __init__(
        self,
        hosts: Iterable[str],
        spares: Iterable[str] = (),
        *,
        min_nodes: int = 1,
        max_nodes: int | None = None,
    ) -> None:
        self.slots: dict[str, HostSlot] = {}
        for host in [*hosts, *spares]:
            self.slots[host] = HostSlot(host)
        self.want = max_nodes or len(self.slots) - len(tuple(spares))
        self.min_nodes = min_nodes
        self.active: list[str] = []  # the current generation's hosts, by node rank
        # Lost since the last plan: even if back already, the next plan takes them last (after
        # spares), so a flaky host does not go straight back into the job it just broke.
        self.recently_lost: set[str] = set()

    # ---- agents -------------------------------------------------------------------------------

    def new_agent(self, host: str) -> str:
        """A (re)start of the host's agent: a fresh id, so nothing from an older one is taken
        for the new one's."""
        slot = self.slots.setdefault(host, HostSlot(host))
        slot.incarnation += 1
        slot.agent_id = f"{host}#{slot.incarnation}"
        slot.state = HostState.STARTING
        return slot.agent_id

    def expect(self, host: str, agent_id: str) -> None:
        """An agent a previous controller started (host#N) is the host's current one again
        (a resumed controller adopting its generation)."""
        slot = self.slots.setdefault(host, HostSlot(host))
        slot.incarnation = max(slot.incarnation, int(agent_id.rpartition("#")[2] or 0))
        slot.agent_id = agent_id
        slot.state = HostState.STARTING

    def forget(self, host: str) -> None:
        """The host's agent is let go; a fresh one starts next (its incarnation numbers on)."""
        slot = self.slots[host]
        slot.agent_id = None
        slot.state = HostState.STARTING

    def adopt(self, hosts: list[str]) -> None:
        """An adopted generation's hosts are the active ones, by node rank."""
        for slot in self.slots.values():
            if slot.state is HostState.ACTIVE:
                slot.state = HostState.READY
        for host in hosts:
            self.slots[host].state = HostState.ACTIVE
        self.active = list(hosts)

    def host_of(self, agent_id: str) -> str | None:
        host = agent_id.rpartition("#")[0]
        slot = self.slots.get(host)
        return host if slot is not None and slot.agent_id == agent_id else None

    def ready(self, agent_id: str) -> bool:
        """The agent said hello; False when it is not the host's current agent."""
        host = self.host_of(agent_id)
        if host is None or self.slots[host].state is not HostState.STARTING:
            return False
        self.slots[host].state = HostState.READY
        return True

    def lost(self, host: str) -> None:
        slot = self.slots[host]
        if slot.state is not HostState.REMOVED:
            slot.state = HostState.LOST
        slot.agent_id = None
        self.recently_lost.add(host)

    def remove(self, host: str) -> HostState:
        """The user took the host away; returns the state it was in."""
        slot = self.slots[host]
        before = slot.state
        slot.state = HostState.REMOVED
        slot.agent_id = None
        return before

    def add(self, host: str) -> None:
        """A host for the pool (new, or back after a removal); its agent starts next."""
        self.slots.setdefault(host, HostSlot(host))
        self.slots[host].state = HostState.STARTING

    # ---- plans --------------------------------------------------------------------------------

    def plan(self, excluded: Callable[[str], bool] = lambda host: False) -> list[str]:
        """The next generation's hosts, by node rank; marks them ACTIVE and the rest READY.
        A host that replaces one of the current generation takes its node rank, and the others
        keep theirs: their ranks then find their own memory snapshots where they are, and only
        the newcomer fetches its ranks' from the peer tier (peer_plan.py)."""
        chosen = self.preview(excluded)
        for slot in self.slots.values():
            if slot.state is HostState.ACTIVE:
                slot.state = HostState.READY
        for host in chosen:
            self.slots[host].state = HostState.ACTIVE
        self.active = chosen
        self.recently_lost.clear()
        return chosen

    def preview(self, excluded: Callable[[str], bool] = lambda host: False) -> list[str]:
        """The hosts `plan` would choose now, changing nothing (the link check probes those
        that would join before they do). Raises NotEnoughHosts as `plan` does."""
        keep = [h for h in self.active if self._usable(h, excluded) and h not in self.recently_lost]
        fill = [h for h in self.slots if h not in keep and self._usable(h, excluded)]
        fill.sort(key=lambda h: h in self.recently_lost)  # stable: spares in order, then those
        chosen: list[str] = []
        for host in self.active:
            if host in keep:
                chosen.append(host)
            elif fill:  # its replacement, in its place; with none left the job shrinks
                chosen.append(fill.pop(0))
        chosen = (chosen + fill)[: self.want]
        if len(chosen) < self.min_nodes or not chosen:
            raise NotEnoughHosts(chosen, self.min_nodes)
        return chosen

    def keep(self, hosts: list[str]) -> None:
        """Narrow the plan to `hosts` (a prefix of it: what a DP x PP layout uses); the others
        go back to READY and wait as spares."""
        for host in self.active:
            if host not in hosts:
                self.slots[host].state = HostState.READY
        self.active = list(hosts)

    def can_grow(self, excluded: Callable[[str], bool] = lambda host: False) -> list[str]:
        """Ready hosts a bigger next generation would add (empty when the job has what it wants)."""
        room = self.want - len(self.active)
        if room <= 0:
            return []
        return [
            h for h in self.slots if self.slots[h].state is HostState.READY and not excluded(h)
        ][:room]

    def needs_replacing(self) -> list[str]:
        """Hosts of the current generation that are gone or were removed."""
        return [h for h in self.active if self.slots[h].state is not HostState.ACTIVE]

    def state(self, host: str) -> HostState:
        return self.slots[host].state

    def in_state(self, *states: HostState) -> list[str]:
        return [h for h, s in self.slots.items() if s.state in states]

    def _usable(self, host: str, excluded: Callable[[str], bool]) -> bool:
        return self.slots[host].state in _USABLE and not excluded(host)
