"""The primary's side of the standby controller (docs/standby.md, agent/standby.py).

With `--standby HOST`, the agent on HOST is told to be the standby (`standby`, port 0, and the
replica's directory there: `<run dir>/.standby/<host>`). Once it says `standby_ready` with its
port, the primary sends it the job directory that `ftrun resume` reads (config.json, the
control files, the checkpoint key, and the journal so far), then every journal line as it is
written, so the standby needs no shared filesystem. Every agent is told where the standby
listens, and every agent that says hello is told this controller's term (ftrun/terms.py): the
host keeps the highest, which is what fences a cut-off primary after a takeover.
"""

from __future__ import annotations

from pathlib import Path

from ftrun.config import LaunchConfig, standby_run_dir
from ftrun.controller.server import ControlServer
from ftrun.journal import EVENTS_FILE, Journal
from ftrun.wire.inbound import Hello
from ftrun.wire.inbound_checks import StandbyReady
from ftrun.wire.messages_standby import REPLICA_CHUNK, REPLICATED

REPLICA_LIMIT = 1 << 30  # bytes of the journal sent whole to a standby that comes (or returns)


def replica_dir(config: LaunchConfig, host: str) -> Path:
    """Where the standby keeps its replica of the job directory (a run directory of its own)."""
    return standby_run_dir(config.job_dir.parent, host)


class StandbyDesk:
    def __init__(self, config: LaunchConfig, *, server: ControlServer, journal: Journal) -> None:
        self.config = config
        self.server = server
        self.journal = journal
        self.host = config.standby  # None: no standby
        self.term = 1  # this controller's run of the job; the supervisor sets it
        self.agent: str | None = None  # the standby host's agent, once ready
        self.where: tuple[str, int] | None = None  # its address and port, once ready
        self.addrs: dict[str, str] = {}  # agent → the address its hello came from
        # A takeover's agents, not yet told its term: a host keeps the highest term it was told
        # and refuses older ones from then on, so a takeover that stands down (most agents still
        # have the primary) must not have told any. None: the term goes out at each hello.
        self.held: list[str] | None = None

    def hold_term(self) -> None:
        """A takeover: tell agents our term only once we lead (lead())."""
        self.held = []

    def lead(self) -> None:
        """The takeover adopts: the agents that came are told its term now."""
        held, self.held = self.held or [], None
        for agent_id in held:
            if agent_id in self.server.links:
                self.server.send(agent_id, "term", term=self.term)

    def heard(self, agent_id: str, host: str, msg: Hello) -> None:
        """A ready agent said hello: our term; where the standby is, or, to the standby host's
        agent, that it is the standby."""
        if self.held is None:
            self.server.send(agent_id, "term", term=self.term)
        else:
            self.held.append(agent_id)
        if msg.addr:
            self.addrs[agent_id] = msg.addr
        if host == self.host:
            where = replica_dir(self.config, host)
            self.server.send(agent_id, "standby", host=host, port=0, term=self.term, dir=str(where))
        elif self.where is not None:
            self._tell(agent_id)

    def ready(self, agent_id: str, msg: StandbyReady) -> None:
        """The standby's agent picked its port: send it the job directory, and follow."""
        addr = self.addrs.get(agent_id)
        if self.host is None or addr is None or self.server.host_of(agent_id) != self.host:
            return
        self.agent, self.where = agent_id, (addr, msg.port)
        self.journal.record("standby_ready", host=self.host, addr=addr, port=msg.port)
        for name in REPLICATED:
            if name == EVENTS_FILE:
                continue
            try:
                data = self.journal.files.read(name, what="a job file for the standby")
            except OSError:
                continue  # not written (no TLS on loopback, no checkpoint key)
            self._send(name, data.decode(), append=False)
        journal = self.journal.files.read(EVENTS_FILE, what="the journal", limit=REPLICA_LIMIT)
        self._send(EVENTS_FILE, journal.decode(), append=False)
        if self._follow not in self.journal.followers:
            self.journal.followers.append(self._follow)
        for other in list(self.server.links):
            if other != agent_id:
                self._tell(other)

    def _tell(self, agent_id: str) -> None:
        assert self.where is not None and self.host is not None
        addr, port = self.where
        self.server.send(agent_id, "standby", host=self.host, addr=addr, port=port, term=self.term)

    def _follow(self, line: str) -> None:
        if self.agent is not None:
            self._send(EVENTS_FILE, line, append=True)

    def _send(self, name: str, text: str, *, append: bool) -> None:
        assert self.agent is not None
        first = True
        for i in range(0, max(1, len(text)), REPLICA_CHUNK):
            piece = text[i : i + REPLICA_CHUNK]
            self.server.send(
                self.agent, "replicate", file=name, data=piece, append=append or not first
            )
            first = False
