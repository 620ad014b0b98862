"""The evidence this host gives the controller about one generation's ranks: how a rank exited
(its last lines, its traceback), whether the ranks hang or sit idle (CPU, output and process
state, sampled; stacks once a verdict is in), and their stacks when the controller asks.

GenerationRun (genrun.py) owns the ranks' bookkeeping and hands this its view of them; what is
judged here, and kept between samples, is the evidence's own: the zero-config idle guard
(idle.py), the ranks seen stopped, the gloo exit-race checks (verdict.py). Whatever the ranks
wrote, what is sent is clipped to bounds (lines.py), so no rank can make a frame too big.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ftrun.agent import error_file, idle, stacks, verdict
from ftrun.agent.hang import HangPolicy, ProgressTracker
from ftrun.agent.lines import (
    REPORT_LINE_CHARS,
    REPORT_TEXT_CHARS,
    STACKS_CHARS,
    clip,
    report_lines,
)
from ftrun.agent.link import ControlLink
from ftrun.agent.tail import GenerationLogs, exception_line, extract_traceback

log = logging.getLogger("ftrun.agent")

EVIDENCE_TAIL_LINES = 20  # a rank's last lines, for rank_exited and stacks
EXIT_RACE_IDLE_S = 2.0  # idle this long at the end of a job: worth a native stack dump


class RankEvidence:
    """Evidence on generation `gen`'s ranks here: `live_ranks` (rank → pid), `job_step` (the
    newest step, None before any), `flush_logs` (forward new output) are the run's own."""

    def __init__(
        self,
        *,
        gen: int,
        directory: Path,
        first_rank: int,
        link: ControlLink,
        logs: GenerationLogs,
        progress: ProgressTracker,
        policy: HangPolicy,
        idle_timeout_s: float,
        live_ranks: Callable[[], dict[int, int]],
        job_step: Callable[[], int | None],
        flush_logs: Callable[[], None],
    ) -> None:
        self.number = gen
        self.directory = directory
        self.first_rank = first_rank
        self.link = link
        self.logs = logs
        self.progress = progress
        self.hang_policy = policy
        self.live_ranks = live_ranks
        self.job_step = job_step
        self.flush_logs = flush_logs
        # What the ranks are doing (idle.py: CPU, output, process state): the zero-config hang
        # guard (off with idle_timeout_s 0) and the evidence a hang verdict needs (verdict.py).
        # `finishing`: a rank of the generation exited 0 (the controller said so): the hang
        # detectors stand down, its exit barrier rules.
        self.idle_guard = idle.IdleGuard(idle_timeout_s)
        self.stopped_samples: dict[int, int] = {}  # rank → samples in a row it was stopped in
        # torch's gloo deadlock at exit (verdict.gloo_exit_race): rank → the idle episode (its
        # start) its native stacks were read in, and whether they showed the deadlock.
        self.race_checked: dict[int, tuple[float, bool]] = {}
        self.race_reported = False
        self.last_sample_t = 0.0
        self.finishing = False
        self.hang_reported = False

    # ---- a rank that exited -------------------------------------------------------------------

    def of_exit(self, rank: int, code: int | None, sig: int | None) -> dict[str, Any]:
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

    async def sample(self) -> tuple[verdict.Found | None, dict[str, Any] | None]:
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
            stepping=self.job_step() is not None,
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
