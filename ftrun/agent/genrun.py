"""One generation as this host runs it: its processes, what its ranks tell the agent, and what
the agent tells the controller about them.

The ranks speak two ways: datagrams (rank_socket.py: started, exited, step, section, finishing)
and their log files (tail.py: new lines, and steps matched by the progress regex). Both land
here, and become the controller's messages for this generation: rank_started, progress, log,
rank_exited (with the rank's last lines and traceback as evidence), rank_hung (with stacks),
stacks on request, and the chaos faults due at a step. The agent (agent.py) owns the lifecycle
around it: it starts and kills the processes, and runs the loops that call in here.

Whatever the ranks write, what goes to the controller is bounded (lines.py, tail.py): no rank
output can make a frame too big, and while the controller is behind, log lines are held back
(counted, and said so) rather than buffered without bound.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ftrun.agent import error_file, idle, inject, stacks, verdict
from ftrun.agent.hang import HangPolicy, ProgressTracker
from ftrun.agent.lines import (
    REPORT_LINE_CHARS,
    REPORT_TEXT_CHARS,
    STACKS_CHARS,
    batches,
    clip,
    report_lines,
)
from ftrun.agent.link import ControlLink
from ftrun.agent.tail import GenerationLogs, RankNews, exception_line, extract_traceback
from ftrun.tasks import TaskSupervisor

log = logging.getLogger("ftrun.agent")

# Unsent bytes on the control connection past which log lines are held back (counted, and said
# so with a marker), so a slow controller cannot make the agent buffer without bound.
MAX_UNSENT_BYTES = 8 * 1024 * 1024
DRAIN_POLLS = 16  # > (BACKLOG_SKIP_BYTES + SKIP_KEEP_BYTES) / READ_CHUNK: enough to catch up
TORCHRUN_TAIL_LINES = 40  # torchrun's own last lines, for gen_exited
EVIDENCE_TAIL_LINES = 20  # a rank's last lines, for rank_exited and stacks
EXIT_RACE_IDLE_S = 2.0  # idle this long at the end of a job: worth a native stack dump


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
        # What the ranks are doing (idle.py: CPU, output, process state): the zero-config hang
        # guard (off with idle_timeout_s 0) and the evidence a hang verdict needs (verdict.py).
        # `finishing`: a rank of the generation exited 0 (the controller said so): the hang
        # detectors stand down, its exit barrier rules.
        self.idle_guard = idle.IdleGuard(float(launch.get("idle_timeout_s") or 0))
        self.stopped_samples: dict[int, int] = {}  # rank → samples in a row it was stopped in
        # torch's gloo deadlock at exit (verdict.gloo_exit_race): rank → the idle episode (its
        # start) its native stacks were read in, and whether they showed the deadlock.
        self.race_checked: dict[int, tuple[float, bool]] = {}
        self.race_reported = False
        self.last_sample_t = 0.0
        self.finishing = False
        self.proc: asyncio.subprocess.Process | None = None  # torchrun (its shim)
        self.pgids: set[int] = set()
        self.rank_pids: dict[int, int] = {}
        self.exited_ranks: set[int] = set()
        # Ranks whose Python code has returned (as_main said so): finalizing, not training.
        self.finishing_ranks: set[int] = set()
        self.steps: dict[int, int] = {}
        self.steps_dirty = False
        self.ckpt_stall_s: float | None = None  # rank 0's checkpoint stall so far, if on this host
        self.hang_reported = False
        self.pending_injections: list[dict[str, Any]] = []
        self.torchrun_tail: list[str] = []
        self.held_back: dict[int | None, int] = {}  # lines not forwarded, by rank
        # A preemption notice's signal, for the ranks that had no handler for it yet: a rank
        # still importing when the notice came gets it once its handler is in (tail loop).
        self.notice: signal.Signals | None = None
        self.noticed_ranks: set[int] = set()

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
        elif kind == "section":
            timeout = event.get("timeout")
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
                self.link.send("rank_started", gen=self.number, rank=rank, pid=event["pid"])
        elif kind == "exited" and rank >= 0:
            self.exited_ranks.add(rank)
            self.progress.on_exit(rank)
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
                **self._exit_evidence(rank, code, sig),
            )

    def _exit_evidence(self, rank: int, code: int | None, sig: int | None) -> dict[str, Any]:
        """A rank's last lines and its traceback: the one torch's `@record` wrote to the rank's
        error file when there is one (exact), else the last traceback in its output."""
        tail = self.logs.tail(rank)
        traceback = extract_traceback(tail)
        exception = exception_line(traceback)
        source = "log" if traceback else None
        path = (
            error_file.find(self.directory / "torchrun", rank - self.first_rank)
            if code != 0 or sig
            else None
        )
        recorded = error_file.read(path) if path is not None else None
        if recorded is not None:
            # Named by where it came from: the file itself is in our work dir, gone with us.
            traceback = recorded["traceback"] or traceback
            exception = recorded["exception"] or exception
            source = "error file"
        return {
            "tail": report_lines(tail[-EVIDENCE_TAIL_LINES:]),
            "traceback": clip(traceback, REPORT_TEXT_CHARS),
            "exception": clip(exception, REPORT_LINE_CHARS),
            "traceback_source": source,
            "usage_error": code == 2 and any("usage:" in line for line in tail),
        }

    def _on_step(self, rank: int, step: int) -> None:
        if rank in self.exited_ranks:
            return
        if rank not in self.finishing_ranks:
            self.progress.on_step(rank, step, time.monotonic())
        first = rank not in self.steps
        if first or step > self.steps[rank]:
            self.steps[rank] = step
            self.steps_dirty = True
        if first:
            self.link.send(
                "progress", gen=self.number, rank=rank, step=step, first=True, t=time.time()
            )
        if self.pending_injections:
            self._maybe_inject()

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

    # ---- hangs, idleness and stacks -----------------------------------------------------------

    def sample_interval(self, now: float) -> float | None:
        """How soon to sample the ranks again: often once a rank is halfway to its allowance
        (the evidence must be fresh when it is due), else at the idle guard's pace (None: off)."""
        if self.finishing:
            return idle.SUSPECT_INTERVAL_S * 2  # a few ranks left; one may be stuck at exit
        if not self.hang_reported:
            for p in self.progress.ranks.values():
                allowance = self.progress.base_allowance(p)
                if allowance is not None and now - p.since > allowance / 2:
                    return idle.SUSPECT_INTERVAL_S
        return self.idle_guard.interval_s

    def on_finishing(self) -> None:
        """A rank of this generation exited 0 (the controller says): the step-based detector
        stands down; the exit barrier and the idle guard watch what is left."""
        self.finishing = True
        self.hang_reported = True

    async def sample_evidence(self) -> tuple[verdict.Found | None, dict[str, Any] | None]:
        """Sample CPU, output and state of the live ranks. Returns a local hang verdict (a
        stopped or spinning rank, verdict.py), and the `idle` message's fields when the
        controller should hear of a change (every rank here idle for a while, or waiting past
        an allowance, or that ended)."""
        live = self.live_ranks()
        cpu, states = (
            await asyncio.get_running_loop().run_in_executor(None, idle.sample_ranks, live)
            if live
            else ({}, {})
        )
        now = time.monotonic()
        judging = not (self.finishing or self.hang_reported)
        base = self.progress.overdue(now, learned=False) if judging else []
        late = self.progress.overdue(now) if judging else []
        self.stopped_samples = {
            r: self.stopped_samples.get(r, 0) + 1
            for r, st in states.items()
            if st in verdict.STOPPED_STATES
        }
        # A section is a pause on purpose; a step since the last sample is progress.
        exempt = {
            r
            for r, p in self.progress.ranks.items()
            if p.section is not None or p.since > self.last_sample_t
        }
        self.last_sample_t = now
        guard = self.idle_guard
        tell, ranks = guard.update(
            now,
            cpu,
            idle.output_bytes(self.directory, set(cpu)),
            exempt=exempt,
            finishing=self.finishing,
            running={r for r, st in states.items() if st == "running"},
            stepping=bool(self.steps),
            overdue=bool(late),
            confirm_s=self.hang_policy.confirm_s,
        )
        found = (
            verdict.local_verdict(
                base,
                late,
                stopped={r for r, n in self.stopped_samples.items() if n >= 2},
                busy=guard.tracker.busy(),
                now=now,
                policy=self.hang_policy,
            )
            if judging
            else None
        )
        await self._exit_race(now, set(cpu))
        news = None
        if tell:
            waiting_past = {str(o.rank): round(o.allowance_s, 3) for o in late}
            wall = time.time() - time.monotonic()
            news = {
                "gen": self.number,
                "ranks": None if ranks is None else {str(r): round(s, 3) for r, s in ranks.items()},
                "overdue": waiting_past if ranks is not None and waiting_past else None,
                "overdue_at": {str(o.rank): round(o.deadline + wall, 3) for o in late}
                if ranks is not None and waiting_past
                else None,
            }
        return found, news

    async def _exit_race(self, now: float, live: set[int]) -> None:
        """Tell the controller once every live rank here is stuck in torch's gloo deadlock at
        exit (verdict.gloo_exit_race). Looked for only where a rank may be at its exit: the job
        is finishing (a rank exited 0), or every rank here has been idle for EXIT_RACE_IDLE_S;
        each rank's native stacks are read once per idle episode (py-spy pauses it briefly)."""
        tracker = self.idle_guard.tracker
        since = {r: tracker.idle_since(r) for r in live}
        idle_long = {r for r, t in since.items() if t is not None and now - t >= EXIT_RACE_IDLE_S}
        if self.race_reported or not live or not (self.finishing or idle_long == live):
            return
        pids = self.live_ranks()
        dumps: dict[int, str] = {}
        for rank in sorted(idle_long):
            episode = since[rank]
            assert episode is not None
            if self.race_checked.get(rank, (None, False))[0] == episode:
                continue
            text = await stacks.native_dump(pids[rank]) if rank in pids else None
            matched = text is not None and verdict.gloo_exit_race(text)
            self.race_checked[rank] = (episode, matched)
            if text is not None:
                dumps[rank] = text
        raced = {r for r in live if self.race_checked.get(r) == (since[r], True) and r in idle_long}
        if raced and raced == live:
            self.race_reported = True
            log.warning("ranks %s are stuck at exit in torch's gloo destructor race", sorted(raced))
            self.link.send(
                "exit_race",
                gen=self.number,
                ranks=sorted(raced),
                stacks={str(r): clip(t, STACKS_CHARS // len(raced)) for r, t in dumps.items()},
            )

    async def report_hang(self, found: verdict.Found, *, detected_t: float) -> None:
        """Capture the stacks of the live ranks, then report the hang. The controller tears
        the generation down only after this, so the stacks are taken from the live processes.
        A spinning rank whose stacks show teardown is not reported: its code is done, and the
        exit rules are the ones that apply (it is no longer watched for progress)."""
        overdue = [found.culprit] + [o for o in found.overdue if o.rank != found.culprit.rank]
        report = await stacks.hang_report(
            overdue, self.live_ranks(), self.logs, flush=self.flush_logs
        )
        culprit = str(found.culprit.rank)
        if found.why == "spinning" and verdict.in_teardown(
            {culprit: report["stacks"].get(culprit, "")}
        ):
            log.info("rank %s is in teardown, not hung: the exit rules apply", culprit)
            self.progress.on_exit(found.culprit.rank)
            self.hang_reported = False
            return
        report["tail"] = report_lines(report["tail"])
        report["stacks"] = {
            r: clip(t, STACKS_CHARS // max(1, len(report["stacks"])))
            for r, t in report["stacks"].items()
        }
        self.link.send(
            "rank_hung",
            gen=self.number,
            step=self.job_step(),
            detected_t=detected_t,
            why=found.why,
            **report,
        )

    async def send_stacks(self) -> None:
        """The stacks, states and last lines of every live rank here (the controller asked)."""
        live = self.live_ranks()
        states = {str(r): stacks.process_state(pid) for r, pid in live.items()}
        dumps = await stacks.capture(self.logs, live, flush=self.flush_logs)
        self.link.send(
            "stacks",
            gen=self.number,
            stacks={str(r): t[: stacks.REPLY_MAX_CHARS] for r, t in dumps.items()},
            states=states,
            tails={str(r): self.logs.tail(r)[-EVIDENCE_TAIL_LINES:] for r in live},
        )

    # ---- signals and chaos ------------------------------------------------------------------

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

    def add_injection(self, request: dict[str, Any]) -> None:
        """`ftrun chaos`: a fault to inject here now, or at a step (inject.py)."""
        self.pending_injections.append(request)
        self._maybe_inject()

    def _maybe_inject(self) -> None:
        for inj in inject.take_due(self.pending_injections, self.steps, self.rank_pids):
            self.tasks.spawn(f"chaos {inj.get('action')}", self._inject(inj))

    async def _inject(self, inj: dict[str, Any]) -> None:
        action, rank = inj["action"], inj.get("rank")
        self.link.send(
            "injected", gen=self.number, action=action, rank=rank, host=self.host, t=time.time()
        )
        await self.link.flush()  # the report must leave before a self-inflicted fault
        log.warning("chaos: %s%s", action, f" rank {rank}" if rank is not None else "")
        inject.perform(action, self.rank_pids.get(rank) if rank is not None else None)

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
