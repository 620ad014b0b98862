"""One generation as this host runs it: its processes, what its ranks tell the agent, and what
the agent tells the controller about them.

The ranks speak two ways: datagrams (rank_socket.py: started, exited, step, section, finishing)
and their log files (tail.py: new lines, and steps matched by the progress regex). Both land
here, and become the controller's messages for this generation: rank_started, progress, log,
rank_exited, and the checkpoint reports. The agent (agent.py) owns the lifecycle around it: it
starts and kills the processes, and runs the loops that call in here. Two parts have modules of
their own, handed this run's view of the ranks:

    rank_evidence.py  how a rank exited (last lines, traceback), hangs and idleness, stacks
    rank_orders.py    what the controller asks done to the ranks: signals, notices, chaos

Whatever the ranks write, what goes to the controller is bounded (lines.py, tail.py): no rank
output can make a frame too big, and while the controller is behind, log lines are held back
(counted, and said so) rather than buffered without bound.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ftrun.agent import verdict
from ftrun.agent.hang import HangPolicy, ProgressTracker
from ftrun.agent.lines import batches
from ftrun.agent.link import ControlLink
from ftrun.agent.pace import Pace, PaceMeter
from ftrun.agent.rank_evidence import RankEvidence
from ftrun.agent.rank_orders import RankOrders
from ftrun.agent.tail import GenerationLogs, RankNews
from ftrun.tasks import TaskSupervisor

log = logging.getLogger("ftrun.agent")

# Unsent bytes on the control connection past which log lines are held back (counted, and said
# so with a marker), so a slow controller cannot make the agent buffer without bound.
MAX_UNSENT_BYTES = 8 * 1024 * 1024
DRAIN_POLLS = 16  # > (BACKLOG_SKIP_BYTES + SKIP_KEEP_BYTES) / READ_CHUNK: enough to catch up
TORCHRUN_TAIL_LINES = 40  # torchrun's own last lines, for gen_exited


class GenerationRun:
    """Built from the controller's `launch` message (KeyError or ValueError when it lacks a
    field); `link` carries what it says, `tasks` runs what it starts (chaos faults)."""

    def __init__(
        self,
        launch: Mapping[str, Any],
        directory: Path,
        *,
        host: str,
        link: ControlLink,
        tasks: TaskSupervisor,
    ) -> None:
        self.number = int(launch["gen"])
        self.directory = directory
        self.host = host
        self.link = link
        self.tasks = tasks
        self.hang_policy = hang = HangPolicy(**launch.get("hang", {}))
        self.logs = GenerationLogs(directory, launch.get("progress_regex"), host=host)
        self.progress = ProgressTracker(hang, expect_progress=hang.expect_progress)
        self.first_rank = int(launch["node_rank"]) * int(launch["nproc_per_node"])
        self.proc: asyncio.subprocess.Process | None = None  # torchrun (its shim)
        self.pgids: set[int] = set()
        self.rank_pids: dict[int, int] = {}
        self.exited_ranks: set[int] = set()
        # Ranks whose Python code has returned (as_main said so): finalizing, not training.
        self.finishing_ranks: set[int] = set()
        self.steps: dict[int, int] = {}
        self.steps_dirty = False
        self.pace = PaceMeter()  # each rank's compute time per step (pace.py)
        self.paces: dict[int, Pace] = {}  # finished windows not sent yet
        self.ckpt_stall_s: float | None = None  # rank 0's checkpoint stall so far, if on this host
        self.torchrun_tail: list[str] = []
        self.held_back: dict[int | None, int] = {}  # lines not forwarded, by rank
        self.evidence = RankEvidence(
            gen=self.number,
            directory=directory,
            first_rank=self.first_rank,
            link=link,
            logs=self.logs,
            progress=self.progress,
            policy=hang,
            idle_timeout_s=float(launch.get("idle_timeout_s") or 0),
            live_ranks=self.live_ranks,
            job_step=self.job_step,
            flush_logs=self.flush_logs,
        )
        self.orders = RankOrders(
            gen=self.number, host=host, link=link, tasks=tasks, live_ranks=self.live_ranks
        )

    def live_ranks(self) -> dict[int, int]:
        """rank → pid of the ranks started and not exited."""
        return {r: pid for r, pid in self.rank_pids.items() if r not in self.exited_ranks}

    def job_step(self) -> int | None:
        return max(self.steps.values()) if self.steps else None

    # ---- what the ranks say over the datagram socket ------------------------------------------

    def on_rank_event(self, event: dict[str, Any]) -> None:
        kind, rank = event["e"], int(event["r"])
        if kind == "step":
            self._on_step(rank, int(event["s"]))
        elif kind == "finishing":
            # The rank's code is done; interpreter finalization (seconds with torch loaded, on a
            # busy host) is no hang. From here a hang is the exit barrier's or the idle guard's.
            self.finishing_ranks.add(rank)
            self.progress.on_exit(rank)
            self.pace.on_exit(rank)
        elif kind == "section":
            timeout = event.get("timeout")
            self.pace.on_section(rank, bool(event.get("begin")))
            self.progress.on_section(
                rank,
                str(event.get("name")),
                None if timeout is None else float(timeout),
                bool(event.get("begin")),
                time.monotonic(),
            )
        elif kind == "ckpt":
            # ftrun.checkpoint committed a checkpoint (rank 0 reports it, after the commit)
            self.link.send(
                "checkpoint_committed",
                gen=self.number,
                rank=rank,
                step=event.get("s"),
                preempt=bool(event.get("p")),
            )
        elif kind == "stall":
            # Rank 0's time blocked on checkpoints so far: sent with the next progress report,
            # not on its own (it comes every save, every step with a snapshot per step).
            stall = float(event["v"])
            if not 0.0 <= stall < 1e9:  # NaN too: a datagram is the rank's word, checked here
                raise ValueError(f"a checkpoint stall of {stall} s")
            self.ckpt_stall_s = stall
        elif kind == "restored":
            self.link.send(
                "checkpoint_restored",
                gen=self.number,
                rank=rank,
                step=event.get("s"),
                tier=event.get("tier"),
                restore_s=event.get("d"),
                skipped=event.get("x"),
            )
        elif kind == "tier":  # a rank's checkpoint memory tier stepped down (capacity.py)
            self.link.send(
                "checkpoint_tier",
                gen=self.number,
                rank=rank,
                **{k: event.get(k) for k in ("tier", "from", "why", "need", "free", "total")},
            )
        elif kind == "started":
            self.pgids.add(int(event["pid"]))
            if event.get("shim"):
                self.pgids.add(int(event["shim"]))
            if rank >= 0:
                self.rank_pids[rank] = int(event["pid"])
                self.progress.on_start(rank, time.monotonic())
                self.pace.on_start(rank, int(event["pid"]))
                self.link.send("rank_started", gen=self.number, rank=rank, pid=event["pid"])
        elif kind == "exited" and rank >= 0:
            self.exited_ranks.add(rank)
            self.progress.on_exit(rank)
            self.pace.on_exit(rank)
            self.drain_logs(rank)
            if (news := self.logs.flush_partial(rank)) is not None:
                self._on_news(rank, news)
            code, sig = event.get("code"), event.get("sig")
            self.link.send(
                "rank_exited",
                gen=self.number,
                rank=rank,
                pid=event.get("pid"),
                exit_code=code,
                signal=_signal_name(sig),
                t_exit=event.get("t"),
                step=self.job_step(),
                **self.evidence.of_exit(rank, code, sig),
            )

    def _on_step(self, rank: int, step: int) -> None:
        if rank in self.exited_ranks:
            return
        if rank not in self.finishing_ranks:
            self.progress.on_step(rank, step, time.monotonic())
            if (pace := self.pace.on_step(rank, step, time.monotonic())) is not None:
                self.paces[rank] = pace
        first = rank not in self.steps
        if first or step > self.steps[rank]:
            self.steps[rank] = step
            self.steps_dirty = True
        if first:
            self.link.send(
                "progress", gen=self.number, rank=rank, step=step, first=True, t=time.time()
            )
        if self.orders.pending_injections:
            self.orders.maybe_inject(self.steps, self.rank_pids)

    def send_progress(self) -> None:
        """The job's step so far (sent at most every so often, by the agent's tail loop)."""
        self.steps_dirty = False
        extra = {} if self.ckpt_stall_s is None else {"stall_s": self.ckpt_stall_s}
        self.link.send(
            "progress",
            gen=self.number,
            rank=None,
            step=self.job_step(),
            first=False,
            t=time.time(),
            **extra,
        )

    def send_pace(self) -> None:
        """The ranks' finished pace windows (sent by the agent's tail loop)."""
        paces, self.paces = self.paces, {}
        ranks = {str(r): [p.step, p.steps, p.wall_s, p.compute_s] for r, p in paces.items()}
        self.link.send("pace", gen=self.number, ranks=ranks)

    # ---- hangs, idleness and stacks: rank_evidence.py -----------------------------------------

    @property
    def hang_reported(self) -> bool:
        """A hang was reported (or the job is finishing): no other verdict is given."""
        return self.evidence.hang_reported

    @hang_reported.setter
    def hang_reported(self, value: bool) -> None:
        self.evidence.hang_reported = value

    def sample_interval(self, now: float) -> float | None:
        return self.evidence.sample_interval(now)

    def on_finishing(self) -> None:
        self.evidence.on_finishing()

    async def sample_evidence(self) -> tuple[verdict.Found | None, dict[str, Any] | None]:
        return await self.evidence.sample()

    async def report_hang(self, found: verdict.Found, *, detected_t: float) -> None:
        await self.evidence.report_hang(found, detected_t=detected_t)

    async def send_stacks(self) -> None:
        await self.evidence.send_stacks()

    # ---- signals and chaos: rank_orders.py ----------------------------------------------------

    def signal_ranks(self, sig: signal.Signals) -> None:
        self.orders.signal_ranks(sig)

    def give_notice(self, sig: signal.Signals) -> None:
        self.orders.give_notice(sig)

    def deliver_notice(self) -> None:
        self.orders.deliver_notice()

    def add_injection(self, request: dict[str, Any]) -> None:
        self.orders.add_injection(request, self.steps, self.rank_pids)

    # ---- output: the ranks' log files and torchrun's own ----------------------------------------

    def flush_logs(self) -> None:
        """Forward new rank output and count the steps in it."""
        for rank, news in self.logs.poll().items():
            self._on_news(rank, news)

    def drain_logs(self, rank: int | None = None) -> None:
        """Read until caught up, for last words: of a rank that exited, or of all once torchrun
        has. A few reads at most: a rank far behind is skipped ahead."""
        for _ in range(DRAIN_POLLS):
            for r, news in self.logs.poll(only=rank).items():
                self._on_news(r, news)
            if not self.logs.behind(only=rank):
                break

    def forward_torchrun(self, lines: list[str]) -> None:
        if lines:
            self.torchrun_tail = (self.torchrun_tail + lines)[-TORCHRUN_TAIL_LINES:]
            self._forward(None, lines)

    def _on_news(self, rank: int, news: RankNews) -> None:
        self._forward(rank, news.lines)
        if news.step is not None:
            self._on_step(rank, news.step)

    def _forward(self, rank: int | None, lines: list[str]) -> None:
        """Send lines in frames that fit; while the controller is behind, hold them back (the
        files keep them) and say how many once it has caught up."""
        if not lines:
            return
        if self.link.unsent_bytes() > MAX_UNSENT_BYTES:
            self.held_back[rank] = self.held_back.get(rank, 0) + len(lines)
            return
        if held := self.held_back.pop(rank, 0):
            where = f" they are in {self.logs.logs[rank].where}" if rank in self.logs.logs else ""
            lines = [
                f"[ftrun: {held} lines not forwarded while the controller was behind;"
                f"{where or ' see the torchrun output on the host'}]",
                *lines,
            ]
        for batch in batches(lines):
            self.link.send("log", gen=self.number, rank=rank, lines=batch)


def _signal_name(sig: int | None) -> str | None:
    if not sig:
        return None
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)
