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
    generations.py   the generation running here: launch, follow, stop, the orders for it
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
import shutil
import signal
import threading
import time
from functools import partial
from typing import Any

from ftrun import terms
from ftrun.agent import link_probe, tiers, watch, workdir
from ftrun.agent.generations import Generations
from ftrun.agent.genrun import GenerationRun
from ftrun.agent.link import ControlLink, watch_stdin
from ftrun.agent.rank_socket import RankSocket
from ftrun.agent.standby import Standby
from ftrun.agent.warm import WarmInterpreter, WarmStartFailed
from ftrun.bootstrap import Bootstrap
from ftrun.errors import EXIT_AGENT_ERROR, EXIT_FENCED
from ftrun.netutil import ALL_INTERFACES, free_port
from ftrun.peercopy.store import PeerStore
from ftrun.tasks import TaskFailure, TaskSupervisor

log = logging.getLogger("ftrun.agent")

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
        self.standby = Standby(boot, self.link)
        self.link.on_controller_gone = self._controller_gone
        self.warm = WarmInterpreter(boot, self.work / "zygote.sock", report=self._warm_failed)
        self.tier = workdir.memory_tier(boot.job_id)
        self.peers = PeerStore(
            tier=self.tier,
            secret=boot.secret,
            job_id=boot.job_id,
            newest_gen=lambda: self.generations.newest_gen,
        )
        self.generations = Generations(
            boot,
            work=self.work,
            link=self.link,
            tasks=self.tasks,
            rank_sock=self.ranks.path,
            warm=self.warm,
            start_warm=self._start_warm,
            peers=self.peers,
            tier=self.tier,
        )
        self.exit_code: int | None = None
        self.finish_reason: str | None = None  # the first reason to end, and when
        self.ended_at = 0.0
        self.done = asyncio.Event()
        self.orders: asyncio.Queue[dict[str, Any]] = asyncio.Queue()  # read, not yet done
        self.stdin_watch: threading.Thread | None = None

    @property
    def lost_controller(self) -> str | None:
        """Why, when this agent ended because its controller was lost (not told to stop)."""
        lost = self.link.lost
        return lost if lost is not None and lost == self.finish_reason else None

    @property
    def gen(self) -> GenerationRun | None:
        """The generation running here, if any (generations.py)."""
        return self.generations.gen

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
                on_fence=self._fence_word,
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
            await self.generations.kill()
            await self.warm.close()
            self.ranks.close()
            shutil.rmtree(self.work, ignore_errors=True)
            # Whether the job ended or this host left it, its memory-tier checkpoints here are
            # of no more use and hold RAM, unless a newer generation than ours has claimed the
            # tier: then it is another host's that shares /dev/shm with us (agents on one machine).
            workdir.remove_memory_tier(self.boot.job_id, newest_gen=self.generations.newest_gen)
            self.link.close()
        return self.exit_code or 0

    def _stdin_closed(self) -> None:
        """EOF on stdin: the launcher (or the ssh session, or srun) is gone. Without a grace
        that is the end. With one, the control connection decides (link.py); over ssh our
        output went into that session, so it goes to a file from now on."""
        if self.boot.controller_grace_s <= 0:
            self.link.lose("stdin closed: the launcher is gone")
            return
        if not self.boot.local:
            workdir.redirect_output(self.work / "agent.log")
        log.warning("stdin closed: the launcher may be gone; waiting for its connection to say")

    def _fence_word(self) -> None:
        """The launcher wrote `fence` on our stdin: it terminates us; unless it is a controller
        that a newer one has superseded here (its word comes late, from a cut-off primary)."""
        if terms.superseded(self.boot.job_id, self.boot.term):
            log.warning("ignored `fence` from the launcher: a newer controller leads this job")
            return
        self._finish(EXIT_FENCED, "the launcher terminates this agent")

    def _controller_gone(self) -> None:
        """The controller is gone (we keep our ranks for the grace): over ssh our output went
        into its session, so it goes to a file from now on; the standby host takes over."""
        if not self.boot.local:
            workdir.redirect_output(self.work / "agent.log")
        self.standby.controller_gone()

    def _finish(self, code: int, reason: str) -> None:
        if self.exit_code is None:
            self.exit_code = code
            self.finish_reason = reason
            self.ended_at = time.time()
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
                terms.forget(self.boot.job_id)  # the job is over
                self.standby.job_over()
                self._finish(0, "shutdown")
                return
            if msg["kind"] == "stop" and msg.get("grace_s", 0) <= 0:
                self.generations.force_stop.set()  # now, not after the orders before it
            self.orders.put_nowait(msg)

    async def _order_loop(self) -> None:
        while True:
            await self._obey(await self.orders.get())

    async def _obey(self, msg: dict[str, Any]) -> None:
        kind, gens = msg["kind"], self.generations
        run = gens.current(msg.get("gen"))
        if kind == "launch":
            await gens.launch_or_report(msg)
        elif kind == "stop":
            if msg.get("grace_s", 0) <= 0:
                gens.force_stop.set()
            self.tasks.spawn("stop", gens.stop(msg.get("gen"), float(msg.get("grace_s", 0))))
        elif kind == "signal":
            gens.signal_ranks(msg.get("gen"), str(msg.get("signal")))
        elif kind == "preempt":
            gens.preempt(msg.get("gen"), str(msg.get("signal")))
        elif kind == "persist":
            gens.raise_persist_flag(msg.get("gen"))
        elif kind == "inject":
            if run is not None:
                run.add_injection(msg)
        elif kind == "finishing":
            if run is not None:
                run.on_finishing()
        elif kind == "capture_stacks":
            self.tasks.spawn("stacks for the exit barrier", gens.send_stacks(msg.get("gen")))
        elif kind == "term":  # the leading controller's term (terms.py)
            self._hear_term(int(msg["term"]))
        elif kind == "standby":
            self.standby.on_standby(msg)
        elif kind == "replicate":
            self.standby.replicate(msg)
        elif kind == "link_check":  # before a generation (link_probe.py)
            self.tasks.spawn("link check", link_probe.link_check(self.boot.python, msg, self.link))

    def _hear_term(self, term: int) -> None:
        """Obey a controller's term, or leave a controller older than the one that leads this
        host (a standby's takeover that a resume by hand overtook): drop its connection and dial
        again, keeping the ranks; it counts us among those that did not come."""
        if terms.obey(self.boot.job_id, term):
            return
        leader = terms.current(self.boot.job_id)
        log.warning("left a controller of term %d: term %d leads this job here", term, leader)
        if self.link.chan is not None:
            self.link.chan.abort()

    async def _heartbeat_loop(self) -> None:
        await self.link.heartbeat_loop(lambda: self.gen.number if self.gen else None)

    # ---- watching the generation: datagrams here, output and idleness in watch.py ------------

    def _on_rank_event(self, event: dict[str, Any]) -> None:
        run = self.gen
        if run is None or event.get("g") != run.number:
            return  # a stale generation's news
        run.on_rank_event(event)
