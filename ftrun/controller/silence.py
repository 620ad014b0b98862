"""Which agents have gone silent, and what their silence means: the controller's heartbeats out,
the silence check, and the lateness figures (docs/timeouts.md).

An agent silent for host_lost_timeout_s is lost (`lose`, the server's). Silence alone is weak
evidence on a busy machine, so two things keep it honest:
- an agent known to be there is *slow*, not lost: a local agent whose process the transport
  knows to be alive, or a remote one whose machine still acknowledges our heartbeats
  (fleet.agent_alive, peer_kernel.py): an `agent_slow` event, then `agent_recovered` when it
  speaks again; it is lost when its process exits or its machine stops answering, or after
  local_stall_timeout_s of silence (0: never);
- when our own loop wakes up late (we were stalled, not the agents), the silence check waits one
  tick, so that the heartbeats waiting in our socket buffers are read before anyone is judged.
Heartbeat lateness and our loop's lag are journaled every STATS_INTERVAL_S (`heartbeat_stats`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ftrun.controller.hello import AgentLink
from ftrun.controller.lateness import Lateness

log = logging.getLogger("ftrun.controller")

LOSS_CHECK_INTERVAL_S = 0.05
# A silence check that wakes this much later than asked was stalled itself: it defers one tick.
STALLED_TICK_S = 0.1
STATS_INTERVAL_S = 10.0

# Transport knowledge of an agent's process: True alive, False gone, None unknown (remote).
Liveness = Callable[[str], "bool | None"]
EventSink = Callable[..., Any]


class SilenceWatch:
    def __init__(
        self,
        *,
        heartbeat_interval_s: float,
        host_lost_timeout_s: float,
        local_stall_timeout_s: float,
        alive: Liveness | None,
        on_event: EventSink | None,
        lose: Callable[[AgentLink, str], None],
        acked: Callable[[str], int | None] = lambda agent_id: None,
    ) -> None:
        self.heartbeat_interval_s = heartbeat_interval_s
        self.host_lost_timeout_s = host_lost_timeout_s
        self.local_stall_timeout_s = local_stall_timeout_s
        self.alive = alive
        self.on_event = on_event
        self.lose = lose
        self.acked = acked  # an agent's output handled so far (output_acks.py): on heartbeats
        # Live agent links, least recently heard first: the silence check looks only at the head.
        self._by_last_seen: OrderedDict[str, AgentLink] = OrderedDict()
        # Silent past the timeout but alive (the transport says so): slow, watched every tick.
        self._slow: dict[str, AgentLink] = {}
        self.lateness = Lateness(heartbeat_interval_s)
        self._heartbeats: asyncio.Task[None] | None = None

    def watch(self, link: AgentLink) -> None:
        """An agent that said hello: heard from now on."""
        self._by_last_seen[link.agent_id] = link

    def forget(self, agent_id: str) -> None:
        self._by_last_seen.pop(agent_id, None)
        self._slow.pop(agent_id, None)

    def watched(self) -> int:
        """How many agents are connected and not lost (slow ones included)."""
        return len(self._by_last_seen) + len(self._slow)

    def heard(self, link: AgentLink, heartbeat: bool, now: float) -> None:
        if heartbeat:
            if link.last_heartbeat is not None:
                self.lateness.heartbeat_gap(now - link.last_heartbeat)
            link.last_heartbeat = now
        if self._slow.pop(link.agent_id, None) is not None:
            silent = now - link.last_seen
            log.warning("%s speaks again after %.2f s of silence", link.agent_id, silent)
            self._event(
                "agent_recovered", host=link.host, agent=link.agent_id, silent_s=round(silent, 3)
            )
            self._by_last_seen[link.agent_id] = link
        else:
            self._by_last_seen.move_to_end(link.agent_id)

    def stop(self) -> None:
        """Cancel the loop, and report the last period's figures."""
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            self.report_lateness()

    def _event(self, kind: str, **fields: Any) -> None:
        if self.on_event is not None:
            self.on_event(kind, **fields)

    async def loop(self) -> None:
        # Check silence more often than we send, so detection is bounded by the timeout plus one
        # short tick; each check costs O(agents lost or slow), not O(agents), thanks to the
        # ordering.
        self._heartbeats = asyncio.current_task()  # this run of it: stop() cancels it
        next_send = 0.0
        next_stats = time.monotonic() + STATS_INTERVAL_S
        woke = time.monotonic()
        deferred = False
        while True:
            now = time.monotonic()
            lag = now - woke
            self.lateness.loop_lag(lag)
            if lag > STALLED_TICK_S and not deferred:
                # We were stalled, not (necessarily) the agents: read what they sent meanwhile
                # before judging anyone. At most one tick in a row, so a loop that is always
                # late still checks.
                deferred = True
                self.lateness.deferred_checks += 1
                if lag > self.host_lost_timeout_s / 2:
                    log.warning("the controller's loop stalled for %.2f s", lag)
                    self._event("controller_stalled", stalled_s=round(lag, 3))
            else:
                deferred = False
                self._check_silence(now)
            if now >= next_send:
                next_send = now + self.heartbeat_interval_s
                for link in [*self._by_last_seen.values(), *self._slow.values()]:
                    if (acked := self.acked(link.agent_id)) is None:
                        link.channel.send("heartbeat")
                    else:
                        link.channel.send("heartbeat", acked=acked)
            if now >= next_stats:
                next_stats = now + STATS_INTERVAL_S
                self.report_lateness()
            woke = time.monotonic() + LOSS_CHECK_INTERVAL_S
            await asyncio.sleep(LOSS_CHECK_INTERVAL_S)

    def _check_silence(self, now: float) -> None:
        while self._by_last_seen:
            link = next(iter(self._by_last_seen.values()))
            silent = now - link.last_seen
            if silent <= self.host_lost_timeout_s:
                break
            if self._alive(link):
                # Its process runs: late is not lost (a busy machine, a stalled loop).
                del self._by_last_seen[link.agent_id]
                self._slow[link.agent_id] = link
                log.warning(
                    "%s silent for %.2f s but alive (its process runs, or its machine "
                    "acknowledges us): slow, not lost",
                    link.agent_id,
                    silent,
                )
                self._event(
                    "agent_slow",
                    host=link.host,
                    agent=link.agent_id,
                    pid=link.pid,
                    silent_s=round(silent, 3),
                )
            else:
                self.lose(link, f"no heartbeat for {silent:.2f} s")
        for link in list(self._slow.values()):
            silent = now - link.last_seen
            if not self._alive(link):
                self.lose(link, f"its process exited after {silent:.2f} s of silence")
            elif self.local_stall_timeout_s and silent > self.local_stall_timeout_s:
                self.lose(link, f"alive but silent for {silent:.1f} s (local stall timeout)")

    def _alive(self, link: AgentLink) -> bool:
        return bool(self.alive is not None and self.alive(link.agent_id))

    def report_lateness(self) -> None:
        stats, self.lateness = self.lateness, Lateness(self.heartbeat_interval_s)
        if stats.heartbeats.n or stats.deferred_checks:
            self._event(
                "heartbeat_stats",
                period_s=STATS_INTERVAL_S,
                agents=self.watched(),
                slow=len(self._slow),
                **stats.summary(),
            )
