"""The signals a running job takes from outside, while the supervise loop runs.

The preemption signal (--preempt-signal, Slurm's --signal: SIGUSR2 by default) is a notice that
the job will be stopped soon: preemption.py has the generation commit a checkpoint first.
SIGINT and SIGTERM ask the job to stop: the first with the grace period (ranks get SIGTERM,
then SIGKILL after --term-timeout), a second one kills now. The handler only counts, journals,
tells the user and wakes the loop through the inbox; the loop does the stopping. The signals
named by --forward-signal go to every rank of the running generation instead (not to torchrun,
which would die of them), for the script's own handler: a preemption notice, say.

Its own module so that the supervise loop reads only `count` and not how signals reach it.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable

from ftrun.config import LaunchConfig, standby_run_dir
from ftrun.controller.reporting import Reporter
from ftrun.controller.server import ControlServer
from ftrun.journal import Journal
from ftrun.wire.inbound import PreemptNotice, StopRequested

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class JobSignals:
    def __init__(
        self,
        config: LaunchConfig,
        *,
        server: ControlServer,
        journal: Journal,
        reporter: Reporter,
        generation: Callable[[], int],
    ) -> None:
        self.config = config
        self.server = server
        self.journal = journal
        self.reporter = reporter
        self.generation = generation
        self.count = 0  # stop requests so far: 1 stops gracefully, 2 or more kill now
        self.preempt_pending: str | None = None  # a preemption notice's signal, until honoured
        self.preempt_at = (0.0, 0.0)  # when it came: (monotonic, wall)
        self._installed: list[signal.Signals] = []

    def install(self) -> None:
        """Handle the stop signals and the forwarded ones on the running loop, until remove()."""
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self._on_stop, sig)
        forwarded = [signal.Signals[name] for name in self.config.forward_signals]
        for sig in forwarded:
            loop.add_signal_handler(sig, self._forward, sig)
        self._installed = [*STOP_SIGNALS, *forwarded]
        if self.config.preempt_signal not in self.config.forward_signals:  # forwarding wins
            preempt = signal.Signals[self.config.preempt_signal]
            loop.add_signal_handler(preempt, self._on_preempt, preempt)
            self._installed.append(preempt)

    def remove(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in self._installed:
            loop.remove_signal_handler(sig)
        self._installed = []

    def _on_stop(self, sig: signal.Signals) -> None:
        self.count += 1
        self.journal.record("stop_requested", signal=sig.name, count=self.count)
        if self.count == 1:
            self.reporter.notice(
                f"{sig.name}: stopping; ranks get SIGTERM, then SIGKILL after "
                f"{self.config.term_timeout_s:g} s (again to kill now)",
                level="warning",
            )
        else:
            self.reporter.notice("killing now", level="warning")
            self.server.broadcast("stop", gen=self.generation(), grace_s=0)
        self.server.inbox.put_nowait(("", StopRequested()))

    def superseded(self, host: str) -> None:
        """A host refused our agent because a newer controller leads the job there: a standby
        took it over while we were cut off (docs/standby.md). This controller stops; the job
        goes on there."""
        self.journal.record("superseded", host=host)
        cfg = self.config
        where = (
            f"on {cfg.standby}: `ftrun status {cfg.job_id} --run-dir "
            f"{standby_run_dir(cfg.job_dir.parent, cfg.standby)}`"
            if cfg.standby
            else "`ftrun status` on the standby host"
        )
        self.reporter.notice(
            f"{host} refused this controller: a standby controller took the job over while "
            f"this machine was cut off; stopping here (the job goes on there, {where})",
            level="warning",
        )
        self.count += 1
        self.server.inbox.put_nowait(("", StopRequested()))

    def _on_preempt(self, sig: signal.Signals) -> None:
        """A preemption notice (preemption.py): the running generation commits a checkpoint
        and stops; one that comes between generations is taken up by the next watch."""
        self.preempt_pending = sig.name
        self.preempt_at = (time.monotonic(), time.time())
        self.server.inbox.put_nowait(("", PreemptNotice(signal=sig.name)))

    def _forward(self, sig: signal.Signals) -> None:
        gen = self.generation()
        self.journal.record("signal_forwarded", signal=sig.name, gen=gen or None)
        self.reporter.notice(f"{sig.name}: passing it on to the ranks")
        self.server.broadcast("signal", gen=gen, signal=sig.name)
