"""The agent's life cycle: one connection to the controller, one generation at a time.

    controller ──launch G──▶ agent ──▶ rank_shim torchrun ──▶ torchrun ──▶ rank_shim rank ×N ──▶ ranks
    controller ◀─rank_exited / progress / log / gen_exited── agent ◀─datagrams + log files── shims

The Agent starts up (its work dir, the rank socket, the warm interpreter, the control link), does
what the controller says (launch a generation, stop it, signal or stack its ranks, inject a
fault) while its loops watch the generation, and tears down: it kills everything it started and
removes its files, whether the job ended or it fenced. Its parts, one concept to a module:

    link.py          the connection to the controller, heartbeats, noticing the controller gone
    torchrun_cmd.py  the command and environment that start a generation's torchrun
    rank_socket.py   the datagram socket on which the shims and ranks report
    genrun.py        one generation here: what its ranks say, what the controller hears of it
    watch.py         the timed loops over it: output, hangs, idleness
    warm.py          the warm interpreter (zygote.py) that torchrun and the ranks are forked from

Every task runs under a TaskSupervisor (ftrun/tasks.py), which holds it until it ends: a loop
that raises is reported to the controller (`agent_error`, journaled there) and restarted; a
one-shot task that raises fences the agent, so the controller sees a lost host whose reason is
already in its journal. At the end every task is cancelled, and awaited for a bounded time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import threading
import time
from functools import partial
from typing import Any

from ftrun.agent import procs, tiers, watch, workdir
from ftrun.agent.genrun import GenerationRun
from ftrun.agent.lines import LineSplitter, report_lines
from ftrun.agent.link import ControlLink, watch_stdin
from ftrun.agent.rank_socket import RankSocket
from ftrun.agent.torchrun_cmd import PREEMPT_FLAG, torchrun_command
from ftrun.agent.warm import WarmInterpreter, WarmStartFailed
from ftrun.bootstrap import Bootstrap
from ftrun.errors import EXIT_AGENT_ERROR, EXIT_FENCED
from ftrun.netutil import ALL_INTERFACES, free_port
from ftrun.peercopy.fetch import fetch
from ftrun.peercopy.replicator import Replicator
from ftrun.peercopy.store import PeerStore
from ftrun.tasks import TaskFailure, TaskSupervisor

log = logging.getLogger("ftrun.agent")

TORCHRUN_READ_BYTES = 64 * 1024
# After SIGKILL of its process groups, how long torchrun's shim gets to be reaped before it is
# reported as a survivor.
TORCHRUN_EXIT_TIMEOUT_S = 5.0
# At the end, how long the cancelled tasks get to finish (a cancelled task ends at its next
# await; this bounds one that does not).
TASKS_STOP_TIMEOUT_S = 2.0


class Agent:
    def __init__(self, boot: Bootstrap) -> None:
        self.boot = boot
        self.work = workdir.create()
        self.tasks = TaskSupervisor(on_failure=self._report_failure, on_fatal=self._on_fatal)
        self.link = ControlLink(
            boot,
            fence=partial(self._finish, EXIT_FENCED),
            generation=lambda: self.gen.number if self.gen else None,
        )
        self.ranks = RankSocket(
            str(self.work / "agent.sock"), on_event=self._on_rank_event, report=self.tasks.report
        )
        self.warm = WarmInterpreter(boot, self.work / "zygote.sock", report=self._warm_failed)
        self.gen: GenerationRun | None = None
        self.newest_gen = 0  # the newest generation this agent launched
        self.tier = workdir.memory_tier(boot.job_id)
        self.peers = PeerStore(
            tier=self.tier,
            secret=boot.secret,
            job_id=boot.job_id,
            newest_gen=lambda: self.newest_gen,
        )
        self.exit_code: int | None = None
        self.done = asyncio.Event()
        self.force_stop = asyncio.Event()
        self.orders: asyncio.Queue[dict[str, Any]] = asyncio.Queue()  # read, not yet done
        self.stdin_watch: threading.Thread | None = None

    # ---- life cycle -------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(self._on_loop_exception)
        try:
            self.ranks.open(loop)
            tiers.sweep(self.tier.parent, keep=self.tier)  # those whose agent was killed
            tiers.mark(self.tier)
            if self.boot.warm_start:
                await self._start_warm()
            if not self.boot.local:  # one host has no peer to keep its snapshots
                self.link.peer_port = await self.peers.start()
            await self.link.open(port=free_port(ALL_INTERFACES))
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.add_signal_handler(sig, self._finish, EXIT_FENCED, f"signal {sig.name}")
            for name, loop_fn in (
                ("receive loop", self._receive_loop),
                ("order loop", self._order_loop),
                ("heartbeat loop", self._heartbeat_loop),
                ("tail loop", lambda: watch.tail_loop(lambda: self.gen)),
                (
                    "evidence loop",
                    lambda: watch.evidence_loop(lambda: self.gen, self.link, self.tasks),
                ),
            ):
                self.tasks.spawn(name, loop_fn, restart=True)
            self.stdin_watch = watch_stdin(
                loop,
                on_eof=self._stdin_closed,
                on_fence=partial(self._finish, EXIT_FENCED, "the launcher terminates this agent"),
            )
            await self.done.wait()
        except (OSError, asyncio.TimeoutError) as e:
            log.error(
                "cannot reach the controller at %s:%s: %s",
                self.boot.controller_host,
                self.boot.controller_port,
                e,
            )
            self.exit_code = EXIT_FENCED
        finally:
            self.peers.close()
            self.tasks.cancel_all()
            await self.tasks.wait_all(TASKS_STOP_TIMEOUT_S)
            await self._kill_generation()
            await self.warm.close()
            self.ranks.close()
            shutil.rmtree(self.work, ignore_errors=True)
            # Whether the job ended or this host left it, its memory-tier checkpoints here are
            # of no more use and hold RAM, unless a newer generation than ours has claimed the
            # tier: then it is another host's that shares /dev/shm with us (agents on one machine).
            workdir.remove_memory_tier(self.boot.job_id, newest_gen=self.newest_gen)
            self.link.close()
        return self.exit_code or 0

    def _stdin_closed(self) -> None:
        """EOF on stdin: the launcher (or the ssh session, or srun) is gone. Without a grace
        that is the end. With one, the control connection decides (link.py); over ssh our
        output went into that session, so it goes to a file from now on."""
        if self.boot.controller_grace_s <= 0:
            self._finish(EXIT_FENCED, "stdin closed: the launcher is gone")
            return
        if not self.boot.local:
            workdir.redirect_output(self.work / "agent.log")
        log.warning("stdin closed: the launcher may be gone; waiting for its connection to say")

    def _finish(self, code: int, reason: str) -> None:
        if self.exit_code is None:
            self.exit_code = code
            if code:
                log.warning(
                    "fencing: %s; killing every process of this job on %s", reason, self.boot.host
                )
        self.done.set()

    async def _start_warm(self) -> None:
        """Start the warm interpreter; when it does not listen, say so (the ranks start cold)."""
        failure = await self.warm.start()
        if failure is not None:
            self._warm_failed(failure)
        if self.warm.alive:
            self.tasks.spawn("warm interpreter", self.warm.watch())

    # ---- failures of our own tasks, and of the warm interpreter -------------------------------

    def _report_failure(self, failure: TaskFailure) -> None:
        self.link.send(
            "agent_error",
            gen=self.gen.number if self.gen else None,
            host=self.boot.host,
            **failure.fields(),
        )

    def _on_fatal(self, failure: TaskFailure) -> None:
        self._finish(EXIT_AGENT_ERROR, f"{failure.task} failed ({failure.error})")

    def _on_loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """What asyncio would only print (a callback that raised): reported like a task failure."""
        error = context.get("exception")
        if isinstance(error, asyncio.CancelledError):
            # Python 3.11's asyncio.streams asks a connection handler cancelled at shutdown for
            # its exception, which raises in a callback: cancellation is not a failure.
            return
        if error is None:
            loop.default_exception_handler(context)
            return
        self.tasks.report(str(context.get("message") or "a callback"), error)

    def _warm_failed(self, error: WarmStartFailed) -> None:
        """Logged here and sent as an `agent_error` (the controller journals it and tells the
        user): a job whose restarts quietly turned slow would be a mystery."""
        self.tasks.report("warm interpreter", error)

    # ---- what the controller says -----------------------------------------------------------

    async def _receive_loop(self) -> None:
        """Reads the controller's messages as they come, and only that (the link counts the
        controller alive by what it reads): what they ask is done in order by _order_loop,
        which may wait (a launch fetches its ranks' snapshots from a peer first)."""
        while (msg := await self.link.receive()) is not None:
            if msg["kind"] == "shutdown":
                self._finish(0, "shutdown")
                return
            if msg["kind"] == "stop" and msg.get("grace_s", 0) <= 0:
                self.force_stop.set()  # now, not after the orders before it
            self.orders.put_nowait(msg)

    async def _order_loop(self) -> None:
        while True:
            await self._obey(await self.orders.get())

    async def _obey(self, msg: dict[str, Any]) -> None:
        kind = msg["kind"]
        run = self._current(msg.get("gen"))
        if kind == "launch":
            await self._launch_or_report(msg)
        elif kind == "stop":
            if msg.get("grace_s", 0) <= 0:
                self.force_stop.set()
            self.tasks.spawn("stop", self._stop(msg.get("gen"), float(msg.get("grace_s", 0))))
        elif kind == "signal":
            self._signal_ranks(msg.get("gen"), str(msg.get("signal")))
        elif kind == "preempt":
            self._preempt(msg.get("gen"), str(msg.get("signal")))
        elif kind == "persist":
            self._raise_persist_flag(msg.get("gen"))
        elif kind == "inject":
            if run is not None:
                run.add_injection(msg)
        elif kind == "finishing":
            if run is not None:
                run.on_finishing()
        elif kind == "capture_stacks":
            self.tasks.spawn("stacks for the exit barrier", self._send_stacks(msg.get("gen")))

    async def _heartbeat_loop(self) -> None:
        await self.link.heartbeat_loop(lambda: self.gen.number if self.gen else None)

    def _current(self, number: Any) -> GenerationRun | None:
        """The generation running here if it is `number`, else None (a stale message)."""
        return self.gen if self.gen is not None and self.gen.number == number else None

    def _signal_ranks(self, number: Any, name: str) -> None:
        run = self._current(number)
        if run is None or name not in signal.Signals.__members__:
            log.info("%s for generation %s: no such generation running here", name, number)
            return
        run.signal_ranks(signal.Signals[name])

    def _preempt(self, number: Any, name: str) -> None:
        """A preemption notice: scripts using ftrun.checkpoint persist their next save (they
        see the flag file), and every rank with a handler for the signal gets it."""
        run = self._raise_persist_flag(number)
        if run is not None and name in signal.Signals.__members__:
            run.give_notice(signal.Signals[name])

    def _raise_persist_flag(self, number: Any) -> GenerationRun | None:
        """The flag file ftrun.checkpoint looks for at each save: persist this one at once, and
        report it committed (a preemption notice, or a grow: controller/persist_first.py)."""
        run = self._current(number)
        if run is None:
            log.info("persist flag for generation %s: no such generation running here", number)
            return None
        try:
            (run.directory / PREEMPT_FLAG).touch()
        except OSError as e:
            log.warning("could not raise the persist flag: %s", e)
        return run

    async def _send_stacks(self, number: int | None) -> None:
        """The controller asks (an exit barrier passed, or every host is idle): the stacks,
        states and last lines of every live rank here. Always answers, if only with nothing."""
        run = self._current(number)
        if run is None:
            self.link.send("stacks", gen=number, stacks={}, states={}, tails={})
            return
        await run.send_stacks()

    # ---- generations ------------------------------------------------------------------------

    async def _launch_or_report(self, msg: dict[str, Any]) -> None:
        """A launch that fails here is that generation's failure on this host, with the reason
        (the controller would otherwise wait for ranks that never come)."""
        try:
            await self._launch(msg)
        except Exception as e:  # noqa: BLE001 - any failure to launch is reported, not raised
            failure = self.tasks.report("launch", e)
            self.link.send(
                "gen_exited",
                gen=msg.get("gen"),
                exit_code=127,
                tail=[f"the agent could not launch the generation: {failure.error}"],
            )

    async def _launch(self, msg: dict[str, Any]) -> None:
        await self._kill_generation()
        number = int(msg["gen"])
        self.newest_gen = max(self.newest_gen, number)  # from now on older pushes are refused
        self.peers.fence_older(number)  # and pushes under way from older ones are cut off
        peer = msg.get("peer") or {}
        for source in peer.get("fetch") or []:  # snapshots of the ranks we take over: first
            report = await fetch(
                source, tier=self.tier, gen=number, host=self.boot.host, secret=self.boot.secret
            )
            self.link.send("peer_fetched", gen=number, **report)
            if report["snapshots"]:
                break  # the next source (the replica) is for when this one had none
        directory = self.work / f"g{number}"
        directory.mkdir()
        run = GenerationRun(msg, directory, host=self.boot.host, link=self.link, tasks=self.tasks)
        self.gen = run
        self.force_stop.clear()
        if self.boot.warm_start and not self.warm.alive:
            log.warning("the warm interpreter is gone; starting a new one")
            await self._start_warm()
        cmd = torchrun_command(
            self.boot,
            msg,
            directory=directory,
            agent_sock=self.ranks.path,
            zygote_sock=str(self.warm.sock_path) if self.boot.warm_start else None,
            base_env=os.environ,
        )
        try:
            run.proc = await asyncio.create_subprocess_exec(
                *cmd.argv,
                cwd=cmd.cwd,
                env=cmd.env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as e:
            self.link.send(
                "gen_exited", gen=run.number, exit_code=127, tail=[f"cannot start torchrun: {e}"]
            )
            return
        run.pgids.add(run.proc.pid)
        self.tasks.spawn(f"torchrun output of generation {run.number}", self._follow_torchrun(run))
        if peer.get("to"):
            self._replicate(run, msg, peer)

    def _replicate(self, run: GenerationRun, msg: dict[str, Any], peer: dict[str, Any]) -> None:
        """Keep our ranks' newest snapshots in the peer's memory while this generation runs."""
        first = int(msg["node_rank"]) * int(msg["nproc_per_node"])
        replicator = Replicator(
            tier=self.tier,
            ranks=list(range(first, first + int(msg["nproc_per_node"]))),
            gen=run.number,
            host=self.boot.host,
            peer=(str(peer["to"][0]), int(peer["to"][1])),
            secret=self.boot.secret,
            rate=float(peer.get("rate") or 0),
            running=lambda: self.gen is run,
        )
        self.tasks.spawn(f"peer copy of generation {run.number}", replicator.run())

    async def _follow_torchrun(self, run: GenerationRun) -> None:
        """torchrun's own output, in chunks rather than readline(): a line longer than the
        stream's limit must not end the watch on torchrun's exit."""
        assert run.proc is not None and run.proc.stdout is not None
        splitter = LineSplitter()
        while data := await run.proc.stdout.read(TORCHRUN_READ_BYTES):
            run.forward_torchrun(splitter.feed(data, time.monotonic()).forward)
        run.forward_torchrun(splitter.flush().forward)
        code = await run.proc.wait()
        run.drain_logs()
        if self.gen is run:
            self.link.send(
                "gen_exited", gen=run.number, exit_code=code, tail=report_lines(run.torchrun_tail)
            )

    async def _stop(self, number: int | None, grace_s: float) -> None:
        run = self.gen
        if run is not None and run.number == number and grace_s > 0 and run.proc is not None:
            for pgid in run.pgids:
                procs.killpg_quietly(pgid, signal.SIGTERM)
            try:
                waits = [
                    asyncio.create_task(run.proc.wait()),
                    asyncio.create_task(self.force_stop.wait()),
                ]
                await asyncio.wait(waits, timeout=grace_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
        if self.gen is run:
            survivors = await self._kill_generation()
        else:
            survivors = []
        # A fresh rendezvous port for the next generation, in case we are its node rank 0.
        self.link.send("stopped", gen=number, survivors=survivors, port=free_port(ALL_INTERFACES))

    async def _kill_generation(self) -> list[int]:
        run, self.gen = self.gen, None
        if run is None:
            return []
        exclude = [self.warm.pid] if self.warm.pid is not None else []
        survivors = await asyncio.get_running_loop().run_in_executor(
            None, lambda: procs.kill_all(run.pgids, self.boot.process_tag, exclude=exclude)
        )
        if run.proc is not None:
            try:
                await asyncio.wait_for(run.proc.wait(), TORCHRUN_EXIT_TIMEOUT_S)
            except asyncio.TimeoutError:
                survivors.append(run.proc.pid)
        if survivors:
            log.error("processes survived SIGKILL: %s", survivors)
        # Last words: what the ranks wrote in the moments before they were killed.
        run.drain_logs()
        return survivors

    # ---- watching the generation: datagrams here, output and idleness in watch.py ------------

    def _on_rank_event(self, event: dict[str, Any]) -> None:
        run = self.gen
        if run is None or event.get("g") != run.number:
            return  # a stale generation's news
        run.on_rank_event(event)
