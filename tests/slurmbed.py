"""The Slurm testbed for integration tests: a real Slurm cluster of N nodes on this machine.

Owns starting and always tearing down `scripts/slurm_testbed.sh` (docs/testbed.md) from Python,
so a test gets a real slurmctld and real slurmd nodes to submit to, and faults to inject (a node
set down, a slurmd killed, a power loss), without knowing the script's details. Needs root;
`unavailable_reason()` says why not when it cannot run.

    def test_something(slurm: SlurmBed):         # the session's bed (tests/conftest.py)
        job = slurm.submit(script, "-N", "3")
        slurm.wait_state(job, {"RUNNING"}, timeout_s=30)
        slurm.set_node_down("node2", "fault injected by the test")

Every node is `nodeK` on this one machine: a task learns its node from $SLURMD_NODENAME (its
hostname is the machine's). Two beds can be up at once only with different state dirs and ports
(each pytest-xdist worker has its own bed).
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.testbed import bring_up_lock

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "slurm_testbed.sh"
DEFAULT_STATE_DIR = Path("/tmp/ftrun-slurmbed")
DEFAULT_CTLD_PORT = 16817
DEFAULT_SLURMD_PORT = 17001
# Job states after which a job does not run again by itself (scontrol's names).
FINISHED = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)


class SlurmBedError(RuntimeError):
    """A slurm_testbed.sh or Slurm client command failed; the message carries its stderr."""


def unavailable_reason() -> str | None:
    """Why the Slurm testbed cannot run here, or None.

    Not root, or Slurm missing with no apt-get to install it (`up` installs it otherwise)."""
    if os.geteuid() != 0:
        return "the slurm testbed needs root (slurmd runs job steps as any user)"
    have = all(
        shutil.which(t) or Path("/usr/sbin", t).exists() for t in ("munged", "slurmctld", "slurmd")
    ) and all(shutil.which(t) for t in ("sbatch", "srun", "scontrol", "sinfo"))
    if not have and not shutil.which("apt-get"):
        return "slurm-wlm and munge are not installed and there is no apt-get to install them"
    return None


def parse_record(line: str) -> dict[str, str]:
    """`scontrol show ... -o` output (`Key=Value Key=Value ...`) as a dict. A value may hold
    spaces (Reason=, Command=): words without `=` belong to the value before them."""
    fields: dict[str, str] = {}
    key = None
    for word in line.split():
        name, eq, value = word.partition("=")
        if eq and name and (name[0].isupper() or name[0] == "_"):
            key = name
            fields[key] = value
        elif key is not None:
            fields[key] += " " + word
    return fields


class SlurmBed:
    """`up` on enter, `down` on exit (always, even when `up` failed half-way)."""

    def __init__(
        self,
        n: int = 4,
        *,
        state_dir: Path | None = None,
        ctld_port: int = DEFAULT_CTLD_PORT,
        slurmd_port: int = DEFAULT_SLURMD_PORT,
        up_timeout: float = 600.0,
        command_timeout: float = 30.0,
    ) -> None:
        self.n = n
        self.state_dir = Path(state_dir) if state_dir is not None else DEFAULT_STATE_DIR
        self.ctld_port = ctld_port
        self.slurmd_port = slurmd_port
        self.up_timeout = up_timeout  # the first `up` on a fresh machine installs slurm-wlm
        self.command_timeout = command_timeout
        self.nodes: list[str] = [f"node{k}" for k in range(1, n + 1)]
        self.conf = self.state_dir / "slurm.conf"
        self._script_env = {
            **os.environ,
            "FTRUN_SLURMBED_DIR": str(self.state_dir),
            "FTRUN_SLURMBED_NODES": str(n),
            "FTRUN_SLURMBED_CTLD_PORT": str(ctld_port),
            "FTRUN_SLURMBED_SLURMD_PORT": str(slurmd_port),
        }
        # What Slurm clients (and anything that runs them, like ftrun) need: the bed's slurm.conf,
        # which also names the bed's own munged socket.
        self.env: dict[str, str] = {**os.environ, "SLURM_CONF": str(self.conf)}

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> SlurmBed:
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> None:
        self.script("up", timeout=self.up_timeout)

    def down(self) -> None:
        self.script("down", timeout=60)

    def script(
        self, *args: str, timeout: float | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Runs `scripts/slurm_testbed.sh ARGS` for this bed; raises SlurmBedError on failure."""
        result = subprocess.run(
            ["bash", str(SCRIPT), *args],
            capture_output=True,
            text=True,
            env=self._script_env,
            timeout=timeout or self.command_timeout,
            stdin=subprocess.DEVNULL,
        )
        if check and result.returncode != 0:
            raise SlurmBedError(
                f"slurm_testbed.sh {' '.join(args)} exited {result.returncode}: "
                f"{result.stderr.strip()[-2000:]}"
            )
        return result

    def daemon_pids(self) -> dict[str, int]:
        """Pids from the bed's pid files: munged, slurmctld, slurmd-nodeK (stale ones too)."""
        files = {"munged": self.state_dir / "munge" / "munged.pid"}
        files["slurmctld"] = self.state_dir / "slurmctld.pid"
        for node in self.nodes:
            files[f"slurmd-{node}"] = self.state_dir / f"slurmd-{node}.pid"
        pids = {}
        for name, path in files.items():
            try:
                pids[name] = int(path.read_text().strip())
            except (OSError, ValueError):
                continue
        return pids

    def slurmd_running(self, name: str) -> bool:
        """Whether the node's slurmd is alive (its pid file may be stale after kill_node)."""
        pid = self.daemon_pids().get(f"slurmd-{name}")
        try:
            return pid is not None and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    # -- Slurm clients -----------------------------------------------------------------------

    def run(
        self,
        argv: list[str],
        timeout: float | None = None,
        *,
        check: bool = True,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Runs a Slurm client command (sbatch, srun, scontrol...) against this bed."""
        result = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout or self.command_timeout,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
        if check and result.returncode != 0:
            raise SlurmBedError(
                f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()[-2000:]}"
            )
        return result

    def submit(self, script_path: str | Path, *sbatch_args: str) -> str:
        """`sbatch --parsable ARGS SCRIPT`; returns the job id."""
        out = self.run(["sbatch", "--parsable", *sbatch_args, str(script_path)]).stdout
        return out.strip().split(";")[0]

    def job_info(self, job_id: str) -> dict[str, str]:
        """`scontrol show job -o` as a dict; empty once the job is gone (MinJobAge after it ends)."""
        result = self.run(["scontrol", "show", "job", "-o", job_id], check=False)
        if result.returncode != 0:
            if "Invalid job id" in result.stderr:
                return {}
            raise SlurmBedError(f"scontrol show job {job_id}: {result.stderr.strip()}")
        return parse_record(result.stdout.strip().splitlines()[0]) if result.stdout.strip() else {}

    def job_state(self, job_id: str) -> str | None:
        """JobState (RUNNING, PENDING, COMPLETED...), None once slurmctld has forgotten the job."""
        return self.job_info(job_id).get("JobState")

    def wait_state(
        self, job_id: str, states: Collection[str] | str, timeout_s: float = 30.0
    ) -> dict[str, str]:
        """Polls until the job is in one of `states`; returns its info. Raises AssertionError on
        timeout, or if the job finishes in a state not asked for, with the job's info."""
        wanted = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout_s
        info: dict[str, str] = {}
        while True:
            info = self.job_info(job_id)
            state = info.get("JobState")
            if state in wanted:
                return info
            if state in FINISHED:
                raise AssertionError(f"job {job_id} ended {state}, not {sorted(wanted)}: {info}")
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"job {job_id} not {sorted(wanted)} after {timeout_s} s: {info or 'gone'}"
                )
            time.sleep(0.1)  # poll interval

    def jobs(self) -> list[str]:
        """Ids of the jobs slurmctld still holds that have not finished."""
        out = self.run(["squeue", "-h", "-o", "%i %T"]).stdout
        return [line.split()[0] for line in out.splitlines() if line.split()[1] not in FINISHED]

    def cancel_all(self, timeout_s: float = 30.0) -> None:
        """scancel every job of the bed and wait until none is left running or completing."""
        jobs = self.jobs()
        if jobs:
            self.run(["scancel", *jobs])
        deadline = time.monotonic() + timeout_s
        while self.jobs():
            if time.monotonic() >= deadline:
                out = self.run(["squeue"]).stdout
                raise AssertionError(f"jobs still there {timeout_s} s after scancel:\n{out}")
            time.sleep(0.1)  # poll interval

    def node_info(self, name: str) -> dict[str, str]:
        return parse_record(self.run(["scontrol", "show", "node", "-o", name]).stdout.strip())

    def node_state(self, name: str) -> str:
        """State as scontrol shows it: IDLE, ALLOCATED, MIXED, DOWN+NOT_RESPONDING, IDLE+DRAIN..."""
        return self.node_info(name)["State"]

    def wait_node_state(
        self, name: str, predicate: Callable[[str], bool], what: str, timeout_s: float = 30.0
    ) -> str:
        """Polls node_state until predicate(state); returns it. AssertionError on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.node_state(name)
            if predicate(state):
                return state
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"{name} not {what} after {timeout_s} s: {self.node_info(name)}"
                )
            time.sleep(0.1)  # poll interval

    # -- faults ------------------------------------------------------------------------------

    def set_node_down(self, name: str, reason: str = "ftrun test") -> None:
        """`scontrol update state=down`: slurmctld kills the node's jobs (and requeues those that
        may be). The node stays down until resume_node (ReturnToService=1)."""
        self.run(["scontrol", "update", f"nodename={name}", "state=down", f"reason={reason}"])

    def resume_node(self, name: str) -> None:
        """`scontrol update state=resume`; returns once the node is no longer down."""
        self.run(["scontrol", "update", f"nodename={name}", "state=resume"])
        self.wait_node_state(
            name, lambda s: "DOWN" not in s and "NOT_RESPONDING" not in s, "back from down"
        )

    def kill_slurmd(self, name: str) -> None:
        """SIGKILL the node's slurmd alone (a crashed daemon): its job steps keep running, and
        slurmctld marks the node DOWN+NOT_RESPONDING after SlurmdTimeout (about 15 s here)."""
        pids = self.daemon_pids()
        pid = pids.get(f"slurmd-{name}")
        if pid is None:
            raise SlurmBedError(f"no pid file for the slurmd of {name}")
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 5
        while _alive(pid):
            if time.monotonic() >= deadline:
                raise SlurmBedError(f"slurmd of {name} (pid {pid}) survives SIGKILL for 5 s")
            time.sleep(0.02)

    def kill_node(self, name: str) -> None:
        """Power loss: SIGKILL the node's slurmd, its job steps and their tasks."""
        self.script("kill", name)

    def start_slurmd(self, name: str) -> None:
        """Start the node's slurmd again; returns once slurmctld hears from it. A node that was
        down for not responding is idle again; one set down by hand stays down."""
        self.script("start", name)

    # -- between tests and after `down` ------------------------------------------------------

    def tagged(self) -> list[psutil.Process]:
        """Live processes of this bed: its daemons and the slurmstepd they start carry
        FTRUN_SLURMBED_TAG=<state dir> in their environment (slurm_testbed.sh)."""
        tag = str(self.state_dir)
        found = []
        for proc in psutil.process_iter():
            try:
                if (
                    proc.environ().get("FTRUN_SLURMBED_TAG") == tag
                    and proc.status() != psutil.STATUS_ZOMBIE
                ):
                    found.append(proc)
            except (psutil.Error, OSError):
                continue
        return found

    def steps(self) -> list[psutil.Process]:
        """The bed's live job steps (slurmstepd)."""
        out = []
        for proc in self.tagged():
            try:
                if proc.name().startswith("slurmstepd"):
                    out.append(proc)
            except psutil.Error:
                continue
        return out

    def reset(self, timeout_s: float = 30.0) -> None:
        """No job and no job step left, every node's slurmd running and no node down or drained,
        as after `up`: what a test sharing the bed leaves for the next one. Raises
        AssertionError naming what is left after `timeout_s`."""
        self.cancel_all(timeout_s)
        for node in self.nodes:
            if not self.slurmd_running(node):  # powered off by a test
                self.start_slurmd(node)
            state = self.node_state(node)
            if "DOWN" in state or "DRAIN" in state:
                self.resume_node(node)
        deadline = time.monotonic() + timeout_s
        while steps := self.steps():
            if time.monotonic() >= deadline:
                left = [f"{p.pid} {' '.join(p.cmdline())[:100]}" for p in steps]
                raise AssertionError(f"job steps left {timeout_s} s after scancel: {left}")
            time.sleep(0.1)  # poll interval

    def remains(self) -> list[str]:
        """What of this bed exists (after `down`: nothing): its processes, its state dir."""
        found = []
        for proc in self.tagged():
            try:
                found.append(f"process {proc.pid} {' '.join(proc.cmdline())[:100]}")
            except psutil.Error:
                continue
        if self.state_dir.exists():
            found.append(f"state dir {self.state_dir}")
        return found


def free_port_block(count: int, start: int = 20000, stop: int = 60000) -> int:
    """The first port of `count` consecutive ports that nothing listens on here (checked by
    binding each; a race with another process remains possible, and `up` then fails clearly)."""
    port = start
    while port + count <= stop:
        for offset in range(count):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("0.0.0.0", port + offset))
                except OSError:
                    port += offset + 1
                    break
        else:
            return port
    raise SlurmBedError(f"no {count} consecutive free ports in {start}..{stop}")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def slurm_bed_fixture(
    n: int = 4, *, scope: str = "session", name: str = "slurm", **options: Any
) -> Callable[..., Any]:
    """A pytest fixture `name` giving a SlurmBed of `n` nodes, torn down at the end of `scope`
    and checked to leave nothing behind (`remains`).

    `options` go to SlurmBed (state_dir, ctld_port, slurmd_port); without state_dir the state
    lives in a pytest temporary directory, and without ports the bed takes free ones (from a
    random place, so that beds of concurrent sessions do not race for the same block).
    Skips when `unavailable_reason()`.
    """

    @pytest.fixture(scope=scope, name=name)  # type: ignore[call-overload]
    def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmBed]:
        reason = unavailable_reason()
        if reason:
            pytest.skip(reason)
        kwargs = dict(options)
        kwargs.setdefault("state_dir", tmp_path_factory.mktemp("slurmbed") / "state")
        if "ctld_port" not in kwargs and "slurmd_port" not in kwargs:
            # Below 20000: the ports ftrun picks for rendezvous are 20000 up to the kernel's
            # ephemeral range (ftrun/netutil.py), and a powered-off node's slurmd must find its
            # port free again when it is started.
            base = free_port_block(n + 1, start=random.randrange(10000, 19000, 100))
            kwargs["ctld_port"], kwargs["slurmd_port"] = base, base + 1
        bed = SlurmBed(n, **kwargs)
        try:
            with bring_up_lock():
                bed.up()
            yield bed
        finally:
            bed.down()  # always, even when `up` failed half-way
        left = bed.remains()
        assert not left, f"the Slurm testbed left behind after down: {left}"

    return slurm
