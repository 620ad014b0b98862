"""The controller's half of output that survives a controller change (agent/unacked.py): which
of each agent's numbered messages (`oseq`) it has handled, to acknowledge on its heartbeats,
and which it has already received, to drop when the agent sends them again.

- `fresh` at the edge (server.py): a number at or below the highest received from that agent
  is a message this controller already has (the agent reconnected after a blip and sent again
  what was not yet acknowledged): dropped, so within one controller's life nothing is written
  twice.
- `settled` once the supervise loop is done with the message (inbox.py: when it asks for the
  next one, the last one was written to the job's logs and stdout, or dropped as stale).
- `acked` rides on every heartbeat to the agent (silence.py): the agent forgets what is acked.

Numbers are the agent process's: a hello that is not a rejoin, or from another pid, is a new
agent process, whose numbers start again at 1. A controller started by `ftrun resume` or a
standby's takeover starts empty, so it writes whatever the agents send again: what the dead
controller wrote in its last heartbeat interval, unacknowledged, is written twice (once by
each controller); nothing is lost.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Agent:
    pid: int | None
    received: int = 0  # the highest number taken in
    settled: int = 0  # the highest number handled: written, or dropped as stale


class OutputAcks:
    def __init__(self) -> None:
        self._agents: dict[str, _Agent] = {}
        self.duplicates = 0  # messages dropped as already received

    def hello(self, agent_id: str, *, pid: int | None, rejoin: bool) -> None:
        """An agent connected: the same process again (a rejoin) keeps its numbers."""
        known = self._agents.get(agent_id)
        if known is None or not rejoin or known.pid != pid:
            self._agents[agent_id] = _Agent(pid)

    def fresh(self, agent_id: str, oseq: int) -> bool:
        """Whether a numbered message is new here (False: drop it, it was received before)."""
        agent = self._agents.setdefault(agent_id, _Agent(None))
        if oseq <= agent.received:
            self.duplicates += 1
            return False
        agent.received = oseq
        return True

    def settled(self, agent_id: str, oseq: int) -> None:
        agent = self._agents.get(agent_id)
        if agent is not None and oseq > agent.settled:
            agent.settled = oseq

    def acked(self, agent_id: str) -> int | None:
        """What to acknowledge to the agent; None before anything was handled."""
        agent = self._agents.get(agent_id)
        return agent.settled if agent is not None and agent.settled else None
