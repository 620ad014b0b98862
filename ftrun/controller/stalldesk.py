"""The exit barrier and the idle guard at work (the decisions are in stall.py, pure): their
news from agents, the stacks they ask for, and the journal events they leave.

Messages: agent → controller `idle` (every live rank on that host idle for a while, or busy
again) and `stacks` (the answer to `capture_stacks`); controller → agent `finishing` (a rank of
the generation exited 0: stand the hang detectors down) and `capture_stacks`.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ftrun.config import LaunchConfig
from ftrun.controller import evidence as ev_from
from ftrun.controller.evidence import Failure
from ftrun.controller.server import ControlServer
from ftrun.controller.stall import (
    AskStacks,
    ExitHang,
    Idle,
    StallWatch,
    Teardown,
    stacks_timeout_s,
)
from ftrun.journal import Journal
from ftrun.wire.inbound import ExitRace, RankExited, RankHung, RanksIdle, Report, Stacks

if TYPE_CHECKING:
    from ftrun.controller.generation import GenWatch

log = logging.getLogger("ftrun.controller")


class StallDesk:
    def __init__(
        self,
        config: LaunchConfig,
        *,
        server: ControlServer,
        journal: Journal,
        confirm_s: float = 1.0,
    ) -> None:
        self.config = config
        self.server = server
        self.journal = journal
        self.confirm_s = confirm_s  # the hang policy's: every rank waiting this long is a hang

    def watch(self, agents: set[str]) -> StallWatch:
        cfg = self.config
        return StallWatch(
            agents,
            exit_timeout_s=cfg.exit_timeout_s,
            idle_timeout_s=cfg.idle_timeout_s,
            stacks_timeout_s=stacks_timeout_s(cfg.nproc_per_node),
            confirm_s=self.confirm_s,
        )

    def news(self, watch: GenWatch, agent_id: str, msg: Report) -> bool:
        """Clean rank exits, idle reports, stacks, and hang reports that come too late to
        matter. True when the message was one of those."""
        now, stall = time.monotonic(), watch.stall
        host = watch.hosts.get(agent_id, "?")
        match msg:
            case RankExited(exit_code=0) if not msg.signal:
                if stall.on_clean_exit(int(msg.rank), host, now):
                    # Journaled first, so that its time is the barrier's start (`now`) as nearly
                    # as a wall clock can say: the sends to every agent come after.
                    self.journal.record(
                        "exit_barrier",
                        gen=watch.number,
                        host=host,
                        rank=msg.rank,
                        timeout_s=self.config.exit_timeout_s,
                    )
                    self._finishing(watch)
                return True
            case RankHung() if stall.finishing:
                log.info(
                    "ignored a hang report from %s after a rank exited 0: the exit barrier decides",
                    host,
                )
                return True
            case RanksIdle():
                self._idle(stall, agent_id, msg, now)
                return True
            case Stacks():
                stall.on_stacks(agent_id, msg)
                return True
            case ExitRace():
                self._exit_race(watch, agent_id, host, msg, now)
                return True
        return False

    def _idle(self, stall: StallWatch, agent_id: str, msg: RanksIdle, now: float) -> None:
        ranks, overdue, at = msg.ranks, msg.overdue, msg.overdue_at
        stall.on_idle(
            agent_id,
            {int(r): float(s) for r, s in ranks.items()} if isinstance(ranks, dict) else None,
            now,
            {int(r): float(a) for r, a in overdue.items()} if isinstance(overdue, dict) else None,
            {int(r): float(t) for r, t in at.items()} if isinstance(at, dict) else None,
        )

    def _exit_race(
        self, watch: GenWatch, agent_id: str, host: str, msg: ExitRace, now: float
    ) -> None:
        ranks = [int(r) for r in msg.ranks or []]
        self.journal.record(
            "exit_race_seen", gen=watch.number, host=host, ranks=ranks, stacks=msg.stacks
        )
        log.warning(
            "ranks %s on %s are stuck at exit in torch's gloo destructor race (their code "
            "is done): ended by the exit rules",
            ranks,
            host,
        )
        if watch.stall.on_exit_race(agent_id, min(ranks, default=0), host, now):
            self._finishing(watch)

    def _finishing(self, watch: GenWatch) -> None:
        """The work is done: the step-based detectors stand down, the barrier rules."""
        for agent in watch.agents:
            self.server.send(agent, "finishing", gen=watch.number)

    def poll(self, watch: GenWatch) -> Failure | ExitHang | None:
        """Whatever is due now: ask for stacks, or the stall found once they are in."""
        action = watch.stall.poll(time.monotonic(), time.time())
        if isinstance(action, AskStacks):
            self.journal.record(
                "stacks_requested",
                gen=watch.number,
                why=action.why.value,
                hosts=sorted(watch.hosts.get(a, a) for a in action.agents),
            )
            for agent in action.agents:
                self.server.send(agent, "capture_stacks", gen=watch.number)
            return None
        if isinstance(action, Teardown):
            host = watch.hosts.get(action.agent, "?")
            watch.stall.on_teardown(action.rank, host, time.monotonic())
            self.journal.record(
                "teardown_seen",
                gen=watch.number,
                host=host,
                rank=action.rank,
                ranks=action.ranks,
                timeout_s=self.config.exit_timeout_s,
            )
            log.info(
                "every rank is in teardown (stacks): not a hang; the exit barrier rules (%g s)",
                self.config.exit_timeout_s,
            )
            self._finishing(watch)
            return None
        if isinstance(action, Idle):
            return ev_from.idle(
                action, watch.hosts, watch.max_step, action.detected_wall_t or time.time()
            )
        return action

    def record_exit_hang(self, watch: GenWatch, hang: ExitHang, incident: int) -> str:
        """Journal the exit_hang incident; returns the reason the job ends with."""
        hosts = watch.hosts
        first = min(hang.hung) if hang.hung else None
        who = ", ".join(
            f"rank {r} on {hosts.get(a, a)}" for r, a in hang.hung.items()
        ) or "the ranks on " + ", ".join(sorted(hosts.get(a, a) for a in hang.unanswered))
        done = "was in teardown" if hang.teardown else "exited 0"
        if hang.raced:
            reason = (
                f"{who} stuck at exit in torch's gloo destructor deadlock (pytorch#56297: "
                "~ProcessGroupGloo joins a worker that waits for the GIL) after the script's "
                "code was done; stacks taken, killed. The work was done: succeeded"
            )
        else:
            reason = (
                f"rank {hang.clean_rank} {done} but {who} did not exit within "
                f"{hang.timeout_s:g} s; stacks taken, killed. The work was done: succeeded"
            )
        self.journal.record(
            "fault_detected",
            incident=incident,
            gen=watch.number,
            fault="exit_hang",
            host=hosts.get(hang.hung[first], "?") if first is not None else None,
            rank=first,
            fault_t=None,
            detected_t=time.time(),
            step=watch.max_step,
            allowance_s=hang.timeout_s,
            past_allowance_s=round(hang.waited_s - hang.timeout_s, 3),
            clean_rank=hang.clean_rank,
            clean_host=hang.clean_host,
            exit_race=hang.raced,
            hung_ranks=sorted(hang.hung),
            stacks=hang.stacks,
            states=hang.states,
            tail=hang.tails.get(str(first), []) if first is not None else [],
            stacks_missing_from=sorted(hosts.get(a, a) for a in hang.unanswered),
        )
        self.journal.record(
            "fault_classified",
            incident=incident,
            tier="finish",
            decision="finish",
            rule="exit barrier",
            reason=reason,
        )
        return reason
