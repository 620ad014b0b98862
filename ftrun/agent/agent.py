"""The agent's supervise loop: one connection to the controller, one generation at a time.

    controller ──launch G──▶ agent ──▶ rank_shim torchrun ──▶ torchrun ──▶ rank_shim rank ×N ──▶ ranks
    controller ◀─rank_exited / progress / log / gen_exited── agent ◀─datagrams + log files── shims

If the controller goes silent for fence_timeout_s, or its connection or our stdin closes, the
agent kills everything it started and exits: a partitioned host never trains on as a zombie.
A local agent (the controller is its parent on this host) does not fence on silence alone: the
controller's death closes our stdin at once, and a silent but living controller is only slow.

Both timed checks here (fence, hang) judge others by how long they have been silent; when our own
loop wakes up late we were the ones stalled, so the check waits one tick while what arrived in the
meantime (controller heartbeats, rank progress) is read (docs/timeouts.md).

Every task runs under a TaskSupervisor (ftrun/tasks.py): a loop that raises is reported to the
controller (`agent_error`, journaled there) and restarted; a one-shot task that raises fences the
agent, so the controller sees a lost host whose reason is already in its journal. Whatever the
ranks write, what goes over the connection is bounded (lines.py, tail.py): no rank output can
make a frame too big and stop the tail loop that forwards logs and detects hangs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftrun.agent import error_file, idle, inject, proctitle, procs, stacks, workdir
from ftrun.agent.hang import HangPolicy, Overdue, ProgressTracker
from ftrun.agent.lines import (REPORT_LINE_CHARS, REPORT_TEXT_CHARS, STACKS_CHARS, LineSplitter,
                               batches, clip, report_lines, shrunk)
from ftrun.agent.tail import GenerationLogs, RankNews, exception_line, extract_traceback
from ftrun.bootstrap import Bootstrap
from ftrun.errors import EXIT_AGENT_ERROR, EXIT_FENCED, ProtocolError
from ftrun.netutil import ALL_INTERFACES, free_port
from ftrun.protocol import Channel, open_channel
from ftrun.tasks import TaskFailure, TaskSupervisor

log = logging.getLogger("ftrun.agent")

SHIM = str(Path(__file__).with_name("rank_shim.py"))
TAIL_INTERVAL_S = 0.05
PROGRESS_FLUSH_INTERVAL_S = 0.5
# A timed loop that wakes this much later than it asked was stalled itself: it defers one check.
STALLED_TICK_S = 0.1
# Unsent bytes on the control connection past which log lines are held back (counted, and said
# so with a marker), so a slow controller cannot make the agent buffer without bound.
MAX_UNSENT_BYTES = 8 * 1024 * 1024
TORCHRUN_READ_BYTES = 64 * 1024
DRAIN_POLLS = 16  # > (BACKLOG_SKIP_BYTES + SKIP_KEEP_BYTES) / READ_CHUNK: enough to catch up


@dataclass
class GenerationRun:
    number: int
    directory: Path
    logs: GenerationLogs
    progress: ProgressTracker
    proc: asyncio.subprocess.Process | None = None
    rank_pids: dict[int, int] = field(default_factory=dict)
    hang_reported: bool = False
    pending_injections: list[dict[str, Any]] = field(default_factory=list)
    pgids: set[int] = field(default_factory=set)
    steps: dict[int, int] = field(default_factory=dict)
    steps_dirty: bool = False
    exited_ranks: set[int] = field(default_factory=set)
    # Ranks whose Python code has returned (as_main said so): finalizing, not training.
    finishing_ranks: set[int] = field(default_factory=set)
    torchrun_tail: list[str] = field(default_factory=list)
    first_rank: int = 0  # the global rank of this host's local rank 0
    # Zero-config hang guard (idle.py); None when off. `finishing`: a rank of the generation
    # exited 0 (the controller said so): the hang detectors stand down, its exit barrier rules.
    idle_guard: idle.IdleGuard | None = None
    finishing: bool = False
    held_back: dict[int | None, int] = field(default_factory=dict)  # lines not forwarded


class Agent:
    def __init__(self, boot: Bootstrap) -> None:
        self.boot = boot
        self.work = workdir.create()
        self.sock_path = str(self.work / "agent.sock")
        self.zygote: asyncio.subprocess.Process | None = None
        self.chan: Channel | None = None
        self.gen: GenerationRun | None = None
        self.last_heard = time.monotonic()
        self.exit_code: int | None = None
        self.done = asyncio.Event()
        self.force_stop = asyncio.Event()
        self.datagrams = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.tasks = TaskSupervisor(on_failure=self._report_failure, on_fatal=self._on_fatal)

    # ---- life cycle -------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(self._on_loop_exception)
        try:
            self.datagrams.bind(self.sock_path)
            self.datagrams.setblocking(False)
            loop.add_reader(self.datagrams.fileno(), self._on_datagrams)
            if self.boot.warm_start:
                await self._start_zygote()
            self.chan = await open_channel(self.boot.controller_host, self.boot.controller_port,
                                           self.boot.secret, timeout_s=self.boot.fence_timeout_s)
            # Our end of the control connection is an address the other hosts can reach too:
            # the controller makes it the rendezvous address when we are node rank 0.
            self.chan.send("hello", agent_id=self.boot.agent_id, host=self.boot.host,
                           pid=os.getpid(), addr=self.chan.writer.get_extra_info("sockname")[0],
                           port=free_port(ALL_INTERFACES))
            self.last_heard = time.monotonic()
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.add_signal_handler(sig, self._finish, EXIT_FENCED, f"signal {sig.name}")
            for name, loop_fn in (("receive loop", self._receive_loop),
                                  ("heartbeat loop", self._heartbeat_loop),
                                  ("tail loop", self._tail_loop),
                                  ("idle loop", self._idle_loop)):
                self.tasks.spawn(name, loop_fn, restart=True)
            _watch_stdin(loop, self)
            await self.done.wait()
            self.tasks.cancel_all()
        except (OSError, asyncio.TimeoutError) as e:
            log.error("cannot reach the controller at %s:%s: %s", self.boot.controller_host,
                      self.boot.controller_port, e)
            self.exit_code = EXIT_FENCED
        finally:
            await self._kill_generation()
            if self.zygote is not None and self.zygote.returncode is None:
                self.zygote.kill()
                await self.zygote.wait()
            self.datagrams.close()
            shutil.rmtree(self.work, ignore_errors=True)
            # Whether the job ended or this host left it, its memory-tier checkpoints here are
            # of no more use and hold RAM. (Hosts of the ssh testbed share one /dev/shm: there a
            # leaving host takes the others' memory tier too, and they restore from storage.)
            shutil.rmtree(workdir.memory_tier(self.boot.job_id), ignore_errors=True)
            if self.chan is not None:
                self.chan.close()
        return self.exit_code or 0

    # ---- failures of our own tasks ------------------------------------------------------------

    def _report_failure(self, failure: TaskFailure) -> None:
        self._send("agent_error", gen=self.gen.number if self.gen else None, host=self.boot.host,
                   **failure.fields())

    def _on_fatal(self, failure: TaskFailure) -> None:
        self._finish(EXIT_AGENT_ERROR, f"{failure.task} failed ({failure.error})")

    def _on_loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """What asyncio would only print (a callback that raised): reported like a task failure."""
        error = context.get("exception")
        if error is None:
            loop.default_exception_handler(context)
            return
        self.tasks.report(str(context.get("message") or "a callback"), error)

    def _finish(self, code: int, reason: str) -> None:
        if self.exit_code is None:
            self.exit_code = code
            if code:
                log.warning("fencing: %s; killing every process of this job on %s",
                            reason, self.boot.host)
        self.done.set()

    async def _start_zygote(self) -> None:
        path = self.work / "zygote.sock"
        self.zygote = await asyncio.create_subprocess_exec(
            # The padding argument is room for each fork's own command line (proctitle.py).
            self.boot.python, "-m", "ftrun.agent.zygote", str(path), proctitle.title_room(),
            stdin=asyncio.subprocess.PIPE,
            start_new_session=True, env={**os.environ, "FTRUN_AGENT_ID": self.boot.process_tag})
        deadline = time.monotonic() + 10
        while not path.exists() and time.monotonic() < deadline and self.zygote.returncode is None:
            await asyncio.sleep(0.01)

    # ---- control connection -----------------------------------------------------------------

    async def _receive_loop(self) -> None:
        assert self.chan is not None
        while True:
            try:
                msg = await self.chan.receive()
            except ProtocolError as e:
                log.warning("dropped a message from the controller: %s", e)
                continue
            except (asyncio.IncompleteReadError, ConnectionError, OSError) as e:
                self._finish(EXIT_FENCED, f"lost the controller connection ({e.__class__.__name__})")
                return
            self.last_heard = time.monotonic()
            kind = msg["kind"]
            if kind == "launch":
                await self._launch_or_report(msg)
            elif kind == "stop":
                if msg.get("grace_s", 0) <= 0:
                    self.force_stop.set()
                self.tasks.spawn("stop", self._stop(msg.get("gen"), float(msg.get("grace_s", 0))))
            elif kind == "signal":
                self._signal_ranks(msg.get("gen"), str(msg.get("signal")))
            elif kind == "inject":
                if self.gen is not None and self.gen.number == msg.get("gen"):
                    self.gen.pending_injections.append(msg)
                    self._maybe_inject(self.gen)
            elif kind == "finishing":
                if self.gen is not None and self.gen.number == msg.get("gen"):
                    self.gen.finishing = True
                    self.gen.hang_reported = True  # stands the step-based detector down
            elif kind == "capture_stacks":
                self.tasks.spawn("stacks for the exit barrier", self._send_stacks(msg.get("gen")))
            elif kind == "shutdown":
                self._finish(0, "shutdown")
                return

    def _signal_ranks(self, number: Any, name: str) -> None:
        """--forward-signal: to each live rank's own process, not its process group (a rank's
        data-loader workers would die of a SIGUSR1 they do not handle)."""
        run = self.gen
        if run is None or run.number != number or name not in signal.Signals.__members__:
            log.info("%s for generation %s: no such generation running here", name, number)
            return
        sent = []
        for rank, pid in sorted(run.rank_pids.items()):
            if rank not in run.exited_ranks:
                try:
                    os.kill(pid, signal.Signals[name])
                    sent.append(rank)
                except OSError:
                    pass
        self._send("signalled", gen=run.number, signal=name, ranks=sent)

    async def _heartbeat_loop(self) -> None:
        assert self.chan is not None
        check = StallGuard()
        warned = False
        while True:
            self.chan.send("heartbeat", gen=self.gen.number if self.gen else None)
            silent = time.monotonic() - self.last_heard
            if check.due() and silent > self.boot.fence_timeout_s:
                if not self.boot.local:
                    self._finish(EXIT_FENCED, f"no word from the controller for {silent:.1f} s")
                    return
                if not warned:
                    log.warning("no word from the controller for %.1f s; not fencing: it runs "
                                "on this host, and its exit would close our stdin", silent)
                warned = True
            elif silent <= self.boot.fence_timeout_s:
                warned = False
            await check.sleep(self.boot.heartbeat_interval_s)

    def _send(self, kind: str, **fields: Any) -> None:
        """Send a message; one too big for a frame (a bug: reports are bounded) is sent with
        every field cut short rather than lost, and said so."""
        if self.chan is None:
            return
        try:
            self.chan.send(kind, **fields)
        except ProtocolError as e:
            log.error("%s message too big (%s); sending it cut short", kind, e)
            self.chan.send(kind, **shrunk(fields), shrunk=str(e))

    def _unsent_bytes(self) -> int:
        if self.chan is None or self.chan.writer.transport is None:
            return 0
        return self.chan.writer.transport.get_write_buffer_size()

    # ---- generations ------------------------------------------------------------------------

    async def _launch_or_report(self, msg: dict[str, Any]) -> None:
        """A launch that fails here is that generation's failure on this host, with the reason
        (the controller would otherwise wait for ranks that never come)."""
        try:
            await self._launch(msg)
        except Exception as e:
            failure = self.tasks.report("launch", e)
            self._send("gen_exited", gen=msg.get("gen"), exit_code=127,
                       tail=[f"the agent could not launch the generation: {failure.error}"])

    async def _launch(self, msg: dict[str, Any]) -> None:
        await self._kill_generation()
        number = int(msg["gen"])
        directory = self.work / f"g{number}"
        directory.mkdir()
        hang = HangPolicy(**msg.get("hang", {}))
        logs = GenerationLogs(directory, msg.get("progress_regex"), host=self.boot.host)
        run = GenerationRun(number, directory, logs,
                            ProgressTracker(hang, expect_progress=hang.expect_progress))
        run.first_rank = int(msg["node_rank"]) * int(msg["nproc_per_node"])
        if float(msg.get("idle_timeout_s") or 0) > 0:
            run.idle_guard = idle.IdleGuard(float(msg["idle_timeout_s"]))
        self.gen = run
        self.force_stop.clear()
        if self.boot.warm_start and (self.zygote is None or self.zygote.returncode is not None):
            log.warning("the warm interpreter is gone; starting a new one")
            await self._start_zygote()
        env = {**os.environ, **msg.get("env", {}),
               "FTRUN_JOB_ID": self.boot.job_id, "FTRUN_GENERATION": str(number),
               "FTRUN_HOST": self.boot.host, "FTRUN_AGENT_ID": self.boot.process_tag,
               "FTRUN_AGENT_SOCK": self.sock_path, "FTRUN_RANK_LOG_DIR": str(directory)}
        if self.boot.warm_start:
            env["FTRUN_ZYGOTE_SOCK"] = str(self.work / "zygote.sock")
        cmd = [self.boot.python, "-u", SHIM, "torchrun",
               "--nnodes", str(msg["nnodes"]), "--node-rank", str(msg["node_rank"]),
               "--nproc-per-node", str(msg["nproc_per_node"]),
               "--master-addr", msg["master_addr"], "--master-port", str(msg["master_port"]),
               "--max-restarts", "0", "--monitor-interval", "0.1",
               # TORCHELASTIC_RUN_ID, as torchrun defines it: one id for the whole job.
               "--rdzv-id", self.boot.job_id,
               # torchrun's own files (error files, a mkdtemp per run) go with the agent's
               # work dir, not into /tmp for good.
               "--log-dir", str(directory / "torchrun"),
               SHIM, "rank", *msg["entrypoint"]]
        try:
            run.proc = await asyncio.create_subprocess_exec(
                *cmd, cwd=msg.get("cwd"), env=env, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                start_new_session=True)
        except OSError as e:
            self._send("gen_exited", gen=number, exit_code=127, tail=[f"cannot start torchrun: {e}"])
            return
        run.pgids.add(run.proc.pid)
        self.tasks.spawn(f"torchrun output of generation {number}", self._follow_torchrun(run))

    async def _follow_torchrun(self, run: GenerationRun) -> None:
        """torchrun's own output, in chunks rather than readline(): a line longer than the
        stream's limit must not end the watch on torchrun's exit."""
        assert run.proc is not None and run.proc.stdout is not None
        splitter = LineSplitter()
        while data := await run.proc.stdout.read(TORCHRUN_READ_BYTES):
            self._forward_torchrun(run, splitter.feed(data, time.monotonic()).forward)
        self._forward_torchrun(run, splitter.flush().forward)
        code = await run.proc.wait()
        self._drain_logs(run)
        if self.gen is run:
            self._send("gen_exited", gen=run.number, exit_code=code,
                       tail=report_lines(run.torchrun_tail))

    def _forward_torchrun(self, run: GenerationRun, lines: list[str]) -> None:
        if lines:
            run.torchrun_tail = (run.torchrun_tail + lines)[-40:]
            self._forward(run, None, lines)

    async def _stop(self, number: int | None, grace_s: float) -> None:
        run = self.gen
        if run is not None and run.number == number and grace_s > 0 and run.proc is not None:
            for pgid in run.pgids:
                procs.killpg_quietly(pgid, signal.SIGTERM)
            try:
                waits = [asyncio.create_task(run.proc.wait()),
                         asyncio.create_task(self.force_stop.wait())]
                await asyncio.wait(waits, timeout=grace_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
        if self.gen is run:
            survivors = await self._kill_generation()
        else:
            survivors = []
        # A fresh rendezvous port for the next generation, in case we are its node rank 0.
        self._send("stopped", gen=number, survivors=survivors, port=free_port(ALL_INTERFACES))

    async def _kill_generation(self) -> list[int]:
        run, self.gen = self.gen, None
        if run is None:
            return []
        exclude = [self.zygote.pid] if self.zygote is not None else []
        survivors = await asyncio.get_running_loop().run_in_executor(
            None, lambda: procs.kill_all(run.pgids, self.boot.process_tag, exclude=exclude))
        if run.proc is not None:
            try:
                await asyncio.wait_for(run.proc.wait(), 5)
            except asyncio.TimeoutError:
                survivors.append(run.proc.pid)
        if survivors:
            log.error("processes survived SIGKILL: %s", survivors)
        # Last words: what the ranks wrote in the moments before they were killed.
        self._drain_logs(run)
        return survivors

    # ---- ranks: datagrams from shims and the runtime library, and their log files ----------

    def _on_datagrams(self) -> None:
        while True:
            try:
                data = self.datagrams.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            try:
                event = json.loads(data)
                self._on_rank_event(event)
            except (ValueError, TypeError, KeyError) as e:
                log.warning("dropped a malformed datagram from a rank: %s", e)
            except Exception as e:  # a bug handling it: said, and the next one is read
                self.tasks.report("rank event handler", e)

    def _on_rank_event(self, event: dict[str, Any]) -> None:
        run = self.gen
        if run is None or event.get("g") != run.number:
            return  # a stale generation's news
        kind, rank = event["e"], int(event["r"])
        if kind == "step":
            self._on_step(run, rank, int(event["s"]))
        elif kind == "finishing":
            # The rank's code is done; interpreter finalization (seconds with torch loaded, on a
            # busy host) is no hang. From here a hang is the exit barrier's or the idle guard's.
            run.finishing_ranks.add(rank)
            run.progress.on_exit(rank)
        elif kind == "section":
            timeout = event.get("timeout")
            run.progress.on_section(rank, str(event.get("name")),
                                    None if timeout is None else float(timeout),
                                    bool(event.get("begin")), time.monotonic())
        elif kind == "started":
            run.pgids.add(int(event["pid"]))
            if event.get("shim"):
                run.pgids.add(int(event["shim"]))
            if rank >= 0:
                run.rank_pids[rank] = int(event["pid"])
                run.progress.on_start(rank, time.monotonic())
                self._send("rank_started", gen=run.number, rank=rank, pid=event["pid"])
        elif kind == "exited" and rank >= 0:
            run.exited_ranks.add(rank)
            run.progress.on_exit(rank)
            self._drain_logs(run, rank)
            if (news := run.logs.flush_partial(rank)) is not None:
                self._on_news(run, rank, news)
            code, sig = event.get("code"), event.get("sig")
            self._send("rank_exited", gen=run.number, rank=rank, pid=event.get("pid"),
                       exit_code=code, signal=_signal_name(sig), t_exit=event.get("t"),
                       step=self._job_step(run), **self._exit_evidence(run, rank, code, sig))

    def _exit_evidence(self, run: GenerationRun, rank: int, code: int | None,
                       sig: int | None) -> dict[str, Any]:
        """A rank's last lines and its traceback: the one torch's `@record` wrote to the rank's
        error file when there is one (exact), else the last traceback in its output."""
        tail = run.logs.tail(rank)
        traceback = extract_traceback(tail)
        exception = exception_line(traceback)
        source = "log" if traceback else None
        path = (error_file.find(run.directory / "torchrun", rank - run.first_rank)
                if code != 0 or sig else None)
        recorded = error_file.read(path) if path is not None else None
        if recorded is not None:
            # Named by where it came from: the file itself is in our work dir, gone with us.
            traceback = recorded["traceback"] or traceback
            exception = recorded["exception"] or exception
            source = "error file"
        return {"tail": report_lines(tail[-20:]), "traceback": clip(traceback, REPORT_TEXT_CHARS),
                "exception": clip(exception, REPORT_LINE_CHARS),
                "traceback_source": source,
                "usage_error": code == 2 and any("usage:" in line for line in tail)}

    def _on_step(self, run: GenerationRun, rank: int, step: int) -> None:
        if rank in run.exited_ranks:
            return
        if rank not in run.finishing_ranks:
            run.progress.on_step(rank, step, time.monotonic())
        first = rank not in run.steps
        if first or step > run.steps[rank]:
            run.steps[rank] = step
            run.steps_dirty = True
        if first:
            self._send("progress", gen=run.number, rank=rank, step=step, first=True, t=time.time())
        if run.pending_injections:
            self._maybe_inject(run)

    # ---- fault injection (ftrun chaos) ------------------------------------------------------

    def _maybe_inject(self, run: GenerationRun) -> None:
        for inj in inject.take_due(run.pending_injections, run.steps, run.rank_pids):
            self.tasks.spawn(f"chaos {inj.get('action')}", self._inject(run, inj))

    async def _inject(self, run: GenerationRun, inj: dict[str, Any]) -> None:
        action, rank = inj["action"], inj.get("rank")
        self._send("injected", gen=run.number, action=action, rank=rank, host=self.boot.host,
                   t=time.time())
        if self.chan is not None:
            await self.chan.drain()  # the report must leave before a self-inflicted fault
        log.warning("chaos: %s%s", action, f" rank {rank}" if rank is not None else "")
        inject.perform(action, run.rank_pids.get(rank) if rank is not None else None)

    def _job_step(self, run: GenerationRun) -> int | None:
        return max(run.steps.values()) if run.steps else None

    async def _tail_loop(self) -> None:
        last_progress = 0.0
        check = StallGuard()
        while True:
            run = self.gen
            due = check.due()
            if run is not None:
                self._flush_logs(run)
                now = time.monotonic()
                if due and not run.hang_reported and (overdue := run.progress.overdue(now)):
                    run.hang_reported = True
                    self.tasks.spawn("hang report",
                                     self._report_hang(run, overdue, detected_t=time.time()))
                if run.steps_dirty and now - last_progress >= PROGRESS_FLUSH_INTERVAL_S:
                    run.steps_dirty = False
                    last_progress = now
                    self._send("progress", gen=run.number, rank=None, step=self._job_step(run),
                               first=False, t=time.time())
            await check.sleep(TAIL_INTERVAL_S)

    async def _report_hang(self, run: GenerationRun, overdue: list[Overdue],
                           *, detected_t: float) -> None:
        """Capture the stacks of the overdue ranks, then report the hang. The controller tears
        the generation down only after this, so the stacks are taken from the live processes."""
        live = {r: pid for r, pid in run.rank_pids.items() if r not in run.exited_ranks}
        report = await stacks.hang_report(overdue, live, run.logs,
                                          flush=lambda: self._flush_logs(run))
        report["tail"] = report_lines(report["tail"])
        report["stacks"] = {r: clip(t, STACKS_CHARS // max(1, len(report["stacks"])))
                            for r, t in report["stacks"].items()}
        self._send("rank_hung", gen=run.number, step=self._job_step(run), detected_t=detected_t,
                   **report)

    # ---- the idle guard and stacks on request (controller/stall.py owns the decisions) -------

    async def _idle_loop(self) -> None:
        """Sample CPU and output of the live ranks; tell the controller when every one of them
        has been idle for a while, and when that stops (idle.py)."""
        while True:
            run = self.gen
            guard = run.idle_guard if run is not None else None
            if run is None or guard is None:
                await asyncio.sleep(0.5)
                continue
            try:
                live = {r: pid for r, pid in run.rank_pids.items() if r not in run.exited_ranks}
                cpu = (await asyncio.get_running_loop().run_in_executor(
                    None, idle.sample_cpu, live) if live else {})
                # Ranks that step have the step-based detector; a section is a pause on purpose.
                exempt = set(run.steps) | {r for r, p in run.progress.ranks.items()
                                           if p.section is not None}
                tell, ranks = guard.update(time.monotonic(), cpu,
                                           idle.output_bytes(run.directory, set(cpu)),
                                           exempt=exempt, finishing=run.finishing)
                if tell and self.gen is run:
                    self._send("idle", gen=run.number, ranks=None if ranks is None else
                               {str(r): round(s, 3) for r, s in ranks.items()})
            except Exception:  # noqa: BLE001 - a guard that dies quietly guards nothing
                log.exception("idle guard: sampling failed")
            await asyncio.sleep(guard.interval_s)

    async def _send_stacks(self, number: int | None) -> None:
        """The controller asks (an exit barrier passed, or every host is idle): the stacks,
        states and last lines of every live rank here. Always answers, if only with nothing."""
        run = self.gen
        if run is None or run.number != number:
            self._send("stacks", gen=number, stacks={}, states={}, tails={})
            return
        live = {r: pid for r, pid in run.rank_pids.items() if r not in run.exited_ranks}
        states = {str(r): stacks.process_state(pid) for r, pid in live.items()}
        dumps = await stacks.capture(run.logs, live, flush=lambda: self._flush_logs(run))
        self._send("stacks", gen=number,
                   stacks={str(r): t[:stacks.REPLY_MAX_CHARS] for r, t in dumps.items()},
                   states=states, tails={str(r): run.logs.tail(r)[-20:] for r in live})

    def _flush_logs(self, run: GenerationRun) -> None:
        """Forward new rank output and count the steps in it."""
        for rank, news in run.logs.poll().items():
            self._on_news(run, rank, news)

    def _drain_logs(self, run: GenerationRun, rank: int | None = None) -> None:
        """Read until caught up, for last words: of a rank that exited, or of all once torchrun
        has. A few reads at most: a rank far behind is skipped ahead."""
        for _ in range(DRAIN_POLLS):
            for r, news in run.logs.poll(only=rank).items():
                self._on_news(run, r, news)
            if not run.logs.behind(only=rank):
                break

    def _on_news(self, run: GenerationRun, rank: int, news: RankNews) -> None:
        self._forward(run, rank, news.lines)
        if news.step is not None:
            self._on_step(run, rank, news.step)

    def _forward(self, run: GenerationRun, rank: int | None, lines: list[str]) -> None:
        """Send lines in frames that fit; while the controller is behind, hold them back (the
        files keep them) and say how many once it has caught up."""
        if not lines:
            return
        if self._unsent_bytes() > MAX_UNSENT_BYTES:
            run.held_back[rank] = run.held_back.get(rank, 0) + len(lines)
            return
        if held := run.held_back.pop(rank, 0):
            where = f" they are in {run.logs.logs[rank].where}" if rank in run.logs.logs else ""
            lines = [f"[ftrun: {held} lines not forwarded while the controller was behind;"
                     f"{where or ' see the torchrun output on the host'}]", *lines]
        for batch in batches(lines):
            self._send("log", gen=run.number, rank=rank, lines=batch)


class StallGuard:
    """For a loop that judges others by their silence: due() is False right after the loop woke
    up late (we were stalled; what others sent meanwhile is still unread), never twice in a row,
    so a loop that is always late still judges."""

    def __init__(self) -> None:
        self._wake = time.monotonic()
        self._deferred = False

    def due(self) -> bool:
        late = time.monotonic() - self._wake
        self._deferred = late > STALLED_TICK_S and not self._deferred
        return not self._deferred

    async def sleep(self, seconds: float) -> None:
        self._wake = time.monotonic() + seconds
        await asyncio.sleep(seconds)


def _signal_name(sig: int | None) -> str | None:
    if not sig:
        return None
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def _watch_stdin(loop: asyncio.AbstractEventLoop, agent: Agent) -> None:
    """EOF on stdin means the process that started us (controller, ssh, srun) is gone."""

    def wait_eof() -> None:
        # The raw fd, not sys.stdin: a daemon thread blocked inside a buffered reader makes
        # interpreter shutdown abort ("could not acquire lock ... at interpreter shutdown").
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        loop.call_soon_threadsafe(agent._finish, EXIT_FENCED, "stdin closed: the launcher is gone")

    threading.Thread(target=wait_eof, name="stdin-watch", daemon=True).start()
