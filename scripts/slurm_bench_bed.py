"""What the Slurm benchmarks share (scripts/bench_slurm.py and its batch-node mode,
scripts/bench_slurm_batch.py): the testbed up for the whole run, and a follower of a job's
Slurm output file that says when rank 0's steps appeared, so that "training again" is measured
the same way for ftrun and for plain torchrun.

Imported as `import slurm_bench_bed` by the scripts run as `python scripts/bench_x.py` (their
directory is sys.path[0]).
"""

from __future__ import annotations

import getpass
import os
import re
import socket
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BED = ["bash", str(ROOT / "scripts" / "slurm_testbed.sh")]
STEP = re.compile(r"LOSS rank=0 step=(\d+) |RESTORED rank=0 step=(\d+) ")


class Bed:
    """The testbed of `nodes` nodes in its own directory and ports, up for the whole run."""

    def __init__(self, state_dir: str, scratch: str, *, nodes: int = 4) -> None:
        self.nodes = [f"node{k}" for k in range(1, nodes + 1)]
        self.env = {
            **os.environ,
            # The jobs inherit it (sbatch --export=ALL): torchrun's and the agents' temp dirs
            # go where the bench's temp dir goes away.
            "TMPDIR": scratch,
            "FTRUN_SLURMBED_DIR": state_dir,
            "FTRUN_SLURMBED_NODES": str(nodes),
            "FTRUN_SLURMBED_CTLD_PORT": "16917",
            "FTRUN_SLURMBED_SLURMD_PORT": "17101",
        }

    def __enter__(self) -> Bed:
        try:
            subprocess.run([*BED, "up"], env=self.env, check=True, capture_output=True, timeout=600)
        except BaseException:
            self.__exit__()  # `up` may have started some daemons before it failed
            raise
        for line in subprocess.run(
            [*BED, "env"], env=self.env, check=True, capture_output=True, text=True
        ).stdout.splitlines():
            name, _, value = line.removeprefix("export ").partition("=")
            self.env[name] = value.strip("'\"")
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run([*BED, "down"], env=self.env, capture_output=True, timeout=120)

    def run(self, *argv: str, timeout: float = 60) -> str:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
        return done.stdout

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job -o` as Key=Value fields (values without spaces are enough here)."""
        out = self.run("scontrol", "show", "job", "-o", job_id)
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def state(self, job_id: str) -> str:
        """JobState, and how many times Slurm requeued the job when it did."""
        fields = self.job(job_id)
        state = fields.get("JobState", "?")
        if fields.get("Restarts", "0") != "0":
            state += f" (requeued x{fields['Restarts']})"
        return state

    def wait_end(self, job_id: str, timeout_s: float) -> str:
        """The job's state once it has ended (or as it is after `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        while (state := self.state(job_id)).split()[0] not in ("COMPLETED", "FAILED", "CANCELLED"):
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        return state

    def power_off(self, node: str) -> None:
        subprocess.run([*BED, "kill", node], env=self.env, check=True, capture_output=True)

    def power_on(self, node: str, *, check: bool = True) -> None:
        """Start the node's slurmd again; with check=False a node that runs is no error."""
        subprocess.run([*BED, "start", node], env=self.env, check=check, capture_output=True)

    def wait_idle(self, timeout_s: float = 60) -> None:
        """Every node idle, so that the next job starts on node1 onwards (a node that was
        powered off is DOWN for a while after its slurmd is back)."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = self.run("sinfo", "-h", "-N", "-o", "%N %t").split()[1::2]
            if len(states) == len(self.nodes) and all(s == "idle" for s in states):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"nodes not idle after {timeout_s:g} s: {states}")
            time.sleep(0.2)

    def cancel_all(self) -> None:
        user = getpass.getuser()
        subprocess.run(["scancel", f"--user={user}"], env=self.env, capture_output=True)
        deadline = time.monotonic() + 30
        while self.run("squeue", "-h").strip() and time.monotonic() < deadline:
            time.sleep(0.2)


class Follower:
    """Follows Slurm's output file of a job: when each of rank 0's steps first appeared."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.marks: list[tuple[float, int]] = []  # (time seen, step) of each step line
        # (time seen, is a RESTORED line: a run's start) of every line, in the file's order
        self.lines: list[tuple[float, bool]] = []
        self._offset: dict[Path, int] = {}

    def poll(self) -> None:
        for path in sorted(self.directory.glob("slurm-*.out")):
            with open(path, errors="replace") as f:
                f.seek(self._offset.get(path, 0))
                text = f.read()
                self._offset[path] = f.tell()
            now = time.monotonic()
            for match in STEP.finditer(text):
                if match.group(1) is not None:
                    self.marks.append((now, int(match.group(1))))
                self.lines.append((now, match.group(1) is None))

    def step_since(self, t: float) -> float | None:
        """Seconds from `t` to the first step of a run that started after it, as seen so far:
        the first step line after a RESTORED line seen after `t` (a rank of the old run may
        still print a step or two). None: none yet."""
        self.poll()
        start = next(
            (i for i, (when, restored) in enumerate(self.lines) if restored and when > t), None
        )
        if start is not None:
            steps = [when for when, restored in self.lines[start:] if not restored]
            if steps:
                return steps[0] - t
        return None

    def step_after(self, t: float, timeout_s: float) -> float | None:
        """`step_since(t)`, waited for; None: none within the timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (since := self.step_since(t)) is not None:
                return since
            time.sleep(0.05)
        return None

    def reached(self, step: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.poll()
            if any(s >= step for _, s in self.marks):
                return True
            time.sleep(0.05)
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def made(path: str) -> str:
    """`path`, made (it must not exist yet)."""
    os.makedirs(path)
    return path
