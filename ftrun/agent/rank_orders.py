"""What the controller asks done to one generation's ranks on this host: a signal to forward
(--forward-signal), a preemption notice (to each rank once it has a handler for it), and the
chaos faults of `ftrun chaos` (now, or once the job reaches a step: inject.py). Each is
reported back (`signalled`, `injected`) so the journal says what was done, and to whom.

GenerationRun (genrun.py) passes in its view of the ranks: `live_ranks` (rank → pid of those
started and not exited), and with each step the steps and pids a fault waits for.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from ftrun.agent import inject, stacks
from ftrun.agent.link import ControlLink
from ftrun.tasks import TaskSupervisor

log = logging.getLogger("ftrun.agent")


class RankOrders:
    def __init__(
        self,
        *,
        gen: int,
        host: str,
        link: ControlLink,
        tasks: TaskSupervisor,
        live_ranks: Callable[[], dict[int, int]],
    ) -> None:
        self.number = gen
        self.host = host
        self.link = link
        self.tasks = tasks
        self.live_ranks = live_ranks
        self.pending_injections: list[dict[str, Any]] = []
        # A preemption notice's signal, for the ranks that had no handler for it yet: a rank
        # still importing when the notice came gets it once its handler is in (tail loop).
        self.notice: signal.Signals | None = None
        self.noticed_ranks: set[int] = set()

    # ---- signals ------------------------------------------------------------------------------

    def signal_ranks(self, sig: signal.Signals) -> None:
        """--forward-signal: to each live rank's own process, not its process group (a rank's
        data-loader workers would die of a SIGUSR1 they do not handle)."""
        self._send_signal(sig, sorted(self.live_ranks().items()))

    def give_notice(self, sig: signal.Signals) -> None:
        """A preemption notice: the signal to every rank with a handler for it (by default it
        kills), now or, for a rank still starting up, as soon as its handler is in."""
        self.notice = sig
        self.deliver_notice()

    def deliver_notice(self) -> None:
        """The notice to the ranks that handle it by now and have not had it (the tail loop
        calls this while any rank here lacks it)."""
        if self.notice is None:
            return
        due = [
            (rank, pid)
            for rank, pid in sorted(self.live_ranks().items())
            if rank not in self.noticed_ranks and stacks.catches(pid, self.notice)
        ]
        if due:
            self.noticed_ranks.update(rank for rank, _ in due)
            self._send_signal(self.notice, due)

    def _send_signal(self, sig: signal.Signals, ranks: list[tuple[int, int]]) -> None:
        sent = []
        for rank, pid in ranks:
            try:
                os.kill(pid, sig)
                sent.append(rank)
            except OSError:
                pass
        self.link.send("signalled", gen=self.number, signal=sig.name, ranks=sent)

    # ---- chaos --------------------------------------------------------------------------------

    def add_injection(
        self, request: dict[str, Any], steps: dict[int, int], rank_pids: dict[int, int]
    ) -> None:
        """`ftrun chaos`: a fault to inject here now, or at a step (inject.py)."""
        self.pending_injections.append(request)
        self.maybe_inject(steps, rank_pids)

    def maybe_inject(self, steps: dict[int, int], rank_pids: dict[int, int]) -> None:
        """Inject the faults due by now: the ranks' steps so far, rank → pid of those started."""
        for inj in inject.take_due(self.pending_injections, steps, rank_pids):
            self.tasks.spawn(f"chaos {inj.get('action')}", self._inject(inj, rank_pids))

    async def _inject(self, inj: dict[str, Any], rank_pids: dict[int, int]) -> None:
        action, rank = inj["action"], inj.get("rank")
        self.link.send(
            "injected", gen=self.number, action=action, rank=rank, host=self.host, t=time.time()
        )
        await self.link.flush()  # the report must leave before a self-inflicted fault
        log.warning("chaos: %s%s", action, f" rank {rank}" if rank is not None else "")
        inject.perform(action, rank_pids.get(rank) if rank is not None else None)
