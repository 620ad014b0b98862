"""This host's generations, one at a time: launch one (its ranks' snapshots fetched from a peer
first, then torchrun started in its own session), follow torchrun's output until it exits
(`gen_exited`), keep the ranks' snapshots copied to a peer while it runs, do what the controller
asks of it (signal its ranks, a preemption notice, the persist flag, its stacks), and stop it:
SIGTERM to its process groups with a grace, then SIGKILL of every process tagged with the job,
and torchrun reaped.

The agent (agent.py) reads the controller's messages and hands each order here; what the ranks
say of the running generation is genrun.py's. A message for a generation that is not the one
running here (a stale one) is logged and answered with nothing done.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ftrun.agent import procs
from ftrun.agent.genrun import GenerationRun
from ftrun.agent.lines import LineSplitter, report_lines
from ftrun.agent.link import ControlLink
from ftrun.agent.torchrun_cmd import PREEMPT_FLAG, torchrun_command
from ftrun.agent.warm import WarmInterpreter
from ftrun.bootstrap import Bootstrap
from ftrun.netutil import ALL_INTERFACES, free_port
from ftrun.peercopy.fetch import fetch
from ftrun.peercopy.replicator import Replicator
from ftrun.peercopy.store import PeerStore
from ftrun.tasks import TaskSupervisor

log = logging.getLogger("ftrun.agent")

TORCHRUN_READ_BYTES = 64 * 1024
# After SIGKILL of its process groups, how long torchrun's shim gets to be reaped before it is
# reported as a survivor.
TORCHRUN_EXIT_TIMEOUT_S = 5.0


class Generations:
    """`work` holds each generation's directory; `rank_sock` is where its ranks report;
    `start_warm` starts the warm interpreter again when a launch finds it gone."""

    def __init__(
        self,
        boot: Bootstrap,
        *,
        work: Path,
        link: ControlLink,
        tasks: TaskSupervisor,
        rank_sock: str,
        warm: WarmInterpreter,
        start_warm: Callable[[], Awaitable[None]],
        peers: PeerStore,
        tier: Path,
    ) -> None:
        self.boot = boot
        self.work = work
        self.link = link
        self.tasks = tasks
        self.rank_sock = rank_sock
        self.warm = warm
        self.start_warm = start_warm
        self.peers = peers
        self.tier = tier
        self.gen: GenerationRun | None = None
        self.newest_gen = 0  # the newest generation this agent launched
        self.force_stop = asyncio.Event()

    def current(self, number: Any) -> GenerationRun | None:
        """The generation running here if it is `number`, else None (a stale message)."""
        return self.gen if self.gen is not None and self.gen.number == number else None

    # ---- what the controller asks of the running generation ----------------------------------

    def signal_ranks(self, number: Any, name: str) -> None:
        run = self.current(number)
        if run is None or name not in signal.Signals.__members__:
            log.info("%s for generation %s: no such generation running here", name, number)
            return
        run.signal_ranks(signal.Signals[name])

    def preempt(self, number: Any, name: str) -> None:
        """A preemption notice: scripts using ftrun.checkpoint persist their next save (they
        see the flag file), and every rank with a handler for the signal gets it."""
        run = self.raise_persist_flag(number)
        if run is not None and name in signal.Signals.__members__:
            run.give_notice(signal.Signals[name])

    def raise_persist_flag(self, number: Any) -> GenerationRun | None:
        """The flag file ftrun.checkpoint looks for at each save: persist this one at once, and
        report it committed (a preemption notice, or a grow: controller/persist_first.py)."""
        run = self.current(number)
        if run is None:
            log.info("persist flag for generation %s: no such generation running here", number)
            return None
        try:
            (run.directory / PREEMPT_FLAG).touch()
        except OSError as e:
            log.warning("could not raise the persist flag: %s", e)
        return run

    async def send_stacks(self, number: int | None) -> None:
        """The controller asks (an exit barrier passed, or every host is idle): the stacks,
        states and last lines of every live rank here. Always answers, if only with nothing."""
        run = self.current(number)
        if run is None:
            self.link.send("stacks", gen=number, stacks={}, states={}, tails={})
            return
        await run.send_stacks()

    # ---- launching ----------------------------------------------------------------------------

    async def launch_or_report(self, msg: dict[str, Any]) -> None:
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
        await self.kill()
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
            await self.start_warm()
        cmd = torchrun_command(
            self.boot,
            msg,
            directory=directory,
            agent_sock=self.rank_sock,
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

    async def stop(self, number: int | None, grace_s: float) -> None:
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
            survivors = await self.kill()
        else:
            survivors = []
        # A fresh rendezvous port for the next generation, in case we are its node rank 0.
        self.link.send("stopped", gen=number, survivors=survivors, port=free_port(ALL_INTERFACES))

    async def kill(self) -> list[int]:
        """Kill the running generation's processes, if any; returns the pids that survived."""
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
