"""The one way a generation goes down, whatever ended it: every live agent is told to stop its
ranks (SIGTERM and the grace period first when graceful, SIGKILL at once when not) and confirms;
an agent that does not confirm in time is dropped, so that its host fences.

Its own module because a teardown is a phase of its own with its own reading of the inbox: only
confirmations, losses and errors count, output still arriving is kept for the generation's
logs, and the side channel is served as in every phase. The supervise loop calls it once per
generation and decides what comes next only after it returns.
"""

from __future__ import annotations

import logging
import time

from ftrun.config import LaunchConfig
from ftrun.controller.fleet import Fleet
from ftrun.controller.generation import GenWatch
from ftrun.controller.inbox import Inbox
from ftrun.controller.internal import InternalFailures
from ftrun.controller.reporting import Reporter
from ftrun.controller.server import ControlServer
from ftrun.journal import Journal
from ftrun.wire.inbound import AgentError, AgentLost, Report, Stopped

log = logging.getLogger("ftrun.controller")

TEARDOWN_MARGIN_S = 10.0  # beyond the grace period, for agents to kill, reap and confirm


class Teardown:
    def __init__(
        self,
        config: LaunchConfig,
        *,
        server: ControlServer,
        inbox: Inbox,
        fleet: Fleet,
        internal: InternalFailures,
        journal: Journal,
        reporter: Reporter,
    ) -> None:
        self.config = config
        self.server = server
        self.inbox = inbox
        self.fleet = fleet
        self.internal = internal
        self.journal = journal
        self.reporter = reporter

    async def __call__(self, watch: GenWatch, *, graceful: bool) -> None:
        number = watch.number
        grace = self.config.term_timeout_s if graceful else 0.0
        pending = {a for a, link in self.server.links.items() if not link.lost}
        self.server.broadcast("stop", gen=number, grace_s=grace)
        deadline = time.monotonic() + grace + TEARDOWN_MARGIN_S
        while pending:
            if (got := await self.inbox.next(deadline)) is None:
                # Not confirmed: we cannot count on those hosts; they fence once we stop
                # talking to them, and the next generation waits for that.
                log.error("agents did not confirm the stop of generation %s: %s", number, pending)
                for agent_id in pending:
                    self.server.drop(agent_id, "did not confirm the stop of its generation")
                    self.fleet.on_lost(agent_id)
                break
            agent_id, msg = got
            match msg:
                case AgentLost():
                    pending.discard(agent_id)
                    host = self.fleet.on_lost(agent_id)
                    self.journal.record(
                        "agent_lost", gen=number, host=host, agent=agent_id, reason=msg.reason
                    )
                case Stopped(gen=gen) if gen == number:
                    pending.discard(agent_id)
                    self.fleet.on_stopped(agent_id, msg)
                    if msg.survivors:
                        self.reporter.notice(
                            f"processes survived SIGKILL on "
                            f"{watch.hosts.get(agent_id, agent_id)}: "
                            f"{msg.survivors}",
                            level="error",
                        )
                case AgentError():
                    self.internal.on_agent_error(agent_id, msg)
                case Report(gen=gen) if gen == number and agent_id in watch.agents:
                    if (why := watch.forged(agent_id, msg)) is not None:
                        self.server.refuse(agent_id, msg, why)
                    else:
                        watch.record_output(watch.hosts[agent_id], msg)
                case _:
                    self.inbox.side_channel(agent_id, msg, None)
        self.journal.close_generation_logs(number)
