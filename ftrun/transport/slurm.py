"""The Slurm transport: each node's agent is a job step, `srun --overlap -w NODE`, inside the
allocation that the controller's batch step runs in.

So Slurm accounts for the agent and its ranks, confines them, and kills them with the job; no
ssh is needed. The srun process is a child of the controller, like a local agent, and carries
the agent's stdin and output the way the ssh session does:

- the Bootstrap (with the job secret) goes to srun's stdin, which srun forwards to the task;
  stdin stays open, and when the controller (or srun) dies the agent reads EOF and fences;
- the agent's output comes back through srun into `<job>/agents/<node>.log`;
- a node that fails ends its step: srun exits, and the agent is known gone at once.

Only srun's exit is proof of anything: a running srun says nothing about a node that froze
(slurmctld notices only after SlurmdTimeout), so silence decides, as over ssh.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import signal
from typing import IO

from ftrun import envcontract
from ftrun.agent import procs
from ftrun.bootstrap import Bootstrap
from ftrun.errors import EXIT_AGENT_ERROR, EXIT_FENCED, HostUnreachable
from ftrun.slurmctl import SlurmError
from ftrun.transport import child, slurm_allocation
from ftrun.transport.escalate import escalate

log = logging.getLogger("ftrun.transport")

# srun exits with its task's code: these are the agent's own ways to end (it left nothing).
AGENT_EXITS = (0, EXIT_FENCED, EXIT_AGENT_ERROR)
SWEEP_TIMEOUT_S = 15.0


def unreachable(node: str, error: str) -> HostUnreachable:
    return HostUnreachable(
        node,
        error,
        via="with srun",
        hint=f"check the node with `scontrol show node {node}` and try "
        f"`srun --overlap -w {node} -N1 -n1 true` from the batch step",
    )


class SrunAgent:
    def __init__(
        self, host: str, process_tag: str, python: str, proc: asyncio.subprocess.Process
    ) -> None:
        self.host = host
        self.process_tag = process_tag
        self.python = python
        self.proc = proc

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def alive(self) -> bool | None:
        # srun's exit means the step is over (the agent exited or its node failed); srun
        # running means only that slurmctld has not noticed anything yet.
        return False if self.proc.returncode is not None else None

    async def terminate(self, timeout_s: float) -> None:
        # Told to shut down; if not, EOF on its stdin makes it fence itself; if not, srun is
        # asked to signal the step (SIGTERM: the agent fences), then killed; if the agent is
        # still there after all that, a fresh step on its node kills everything it tagged.
        nudges = [None, self._close_stdin, self._sigterm_srun]
        if not await escalate(self.proc.wait, nudges, timeout_s):
            procs.killpg_quietly(self.proc.pid, signal.SIGKILL)
            await self.proc.wait()
        if self.proc.returncode not in AGENT_EXITS:
            # srun was killed, or died on its own (its node, its connection): the agent may
            # live on; a fresh step on its node kills everything it tagged.
            await self._sweep()
        self._close_stdin()

    def _close_stdin(self) -> None:
        child.close_stdin(self.proc)

    def _sigterm_srun(self) -> None:
        # srun passes SIGTERM on to the step's task (the agent), which fences on it.
        procs.killpg_quietly(self.proc.pid, signal.SIGTERM)

    async def _sweep(self) -> None:
        try:
            sweep = await asyncio.create_subprocess_exec(
                *srun_argv(self.host, "ftrun-sweep"),
                self.python,
                "-m",
                "ftrun.agent.procs",
                self.process_tag,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as e:
            log.warning("%s: could not sweep the agent's processes: %s", self.host, e)
            return
        try:
            await asyncio.wait_for(sweep.wait(), SWEEP_TIMEOUT_S)
        except asyncio.TimeoutError:
            # The node is gone or Slurm is not answering: the agent fences on its own, and
            # Slurm kills what is left of the step when the job ends.
            log.warning("%s: the sweep of the agent's processes did not finish", self.host)
            procs.killpg_quietly(sweep.pid, signal.SIGKILL)
            await sweep.wait()


def srun_argv(node: str, name: str) -> list[str]:
    """One task on `node`, sharing the allocation's resources with the steps already there
    (the controller's batch step, other agents): `--overlap`. `--kill-on-bad-exit=0`: one
    task's exit must not end anything else; `--quiet`: srun's own chatter stays out of the
    agent log unless it is an error. No `--gres`: a step gets the generic resources (GPUs)
    the job has on its node by default, and nodes may differ in how many."""
    argv = [
        shutil.which("srun") or "srun",
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={node}",
        f"--job-name={name}",
        "--kill-on-bad-exit=0",
        "--quiet",
    ]
    return argv


class SrunTransport:
    def __init__(self, *, python: str, controller_addr: str | None = None) -> None:
        self.python = python
        self.controller_addr = controller_addr
        self._dial: dict[str, str] = {}

    def bind_address(self) -> str:
        # Agents on other nodes dial us by whatever address routes there: listen on all of
        # them (every message is authenticated).
        return "0.0.0.0"

    async def start_agent(self, boot: Bootstrap, *, log: IO[bytes]) -> SrunAgent:
        if shutil.which("srun") is None:
            raise unreachable(boot.host, "srun not found on PATH")
        await self._check_node(boot.host)
        dial = self.controller_addr or await self._dial_address(boot.host)
        boot = dataclasses.replace(boot, controller_host=dial)
        # The tag goes to the agent through --export, not in srun's own environment: srun runs
        # on the batch node, and on a node that is also one of the job's (the batch node
        # always is) the agent's sweep of its generation kills every process carrying its tag.
        # A tagged srun was killed with it, and the agent, its stdin closed, fenced.
        export = f"--export=ALL,{envcontract.AGENT_ID}={boot.process_tag}"
        proc = await child.spawn(
            [*srun_argv(boot.host, f"ftrun-agent-{boot.job_id}"), export, boot.python, "-m",
             "ftrun.agent"],
            boot,
            log=log,
            fail=lambda why: unreachable(boot.host, f"could not run srun: {why}"),
            tagged=False,
        )  # fmt: skip
        agent = SrunAgent(boot.host, boot.process_tag, boot.python, proc)
        await child.send_bootstrap(
            proc,
            boot,
            terminate=agent.terminate,
            fail=lambda why: unreachable(boot.host, f"srun did not take the bootstrap ({why})"),
        )
        return agent

    async def _check_node(self, node: str) -> None:
        """A node Slurm does not know, or has down or drained, is unreachable now (and retried
        later, like any lost host): srun would only fail after starting."""
        loop = asyncio.get_running_loop()
        try:
            state = await loop.run_in_executor(None, slurm_allocation.node_state, node)
        except SlurmError as e:
            raise unreachable(node, e.message) from None
        if state in slurm_allocation.DEAD_STATES:
            raise unreachable(node, f"Slurm has the node {state}")

    async def _dial_address(self, node: str) -> str:
        if node not in self._dial:
            loop = asyncio.get_running_loop()
            try:
                addr = await loop.run_in_executor(None, slurm_allocation.node_address, node)
            except SlurmError:
                addr = node
            self._dial[node] = await loop.run_in_executor(None, slurm_allocation.dial_address, addr)
        return self._dial[node]
