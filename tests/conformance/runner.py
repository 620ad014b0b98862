"""Runs the conformance corpus under warm ftrun, cold ftrun and plain torchrun, and compares.

A script conforms when, in every mode, the launcher exits with the same code and the
user-visible output is the same: the `CONF` lines each rank prints in its last attempt (a
killed run is restarted once and resumes from the script's own checkpoint where it has one),
and the traceback of a rank that raised. A run that does not end within its deadline is a hang.

Used by tests/conformance/test_conformance.py (a fast subset) and scripts/conformance.py
(`--trials N` of every script, killed and not).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
MODES = ("warm", "cold", "torchrun")
RANK_PREFIX = re.compile(r"^\[rank\d+\]: ")
# Searched, not matched at the line's start: plain torchrun's ranks share one pipe, and a python -u
# print writes its text and its newline apart, so another rank's text can come first on the
# line ("step 12CONF r0 a0 weight sum ..." in a loaded CI run).
CONF_LINE = re.compile(r"CONF r(\d+) a(\d+) (.*)$")
# ftrun's exit barrier: a rank exited 0 and another did not exit within --exit-timeout. The job
# still succeeds (its work was done), so only this line tells an exit stall from a clean exit.
EXIT_STALL = re.compile(r"^ftrun: rank \d+ exited 0 but .* did not exit within", re.MULTILINE)
# torch's gloo deadlock at exit, read off the stuck rank's native stacks and ended at once by the
# exit rules (agent/verdict.py): counted apart, it costs seconds, not the barrier's timeout.
# torch's own abort at interpreter exit (pytorch/pytorch#179291): a gloo worker still holding a
# tensor with a Python reference takes the GIL while the interpreter is torn down, and C++
# aborts. A DDP model outliving destroy_process_group() keeps its group alive until then.
# Plain torchrun's ranks meet it as often as ftrun's cold ones: nothing of ftrun runs in them.
FINALIZATION_ABORT = "terminate called without an active exception"
EXIT_RACE = re.compile(r"^ftrun: .* stuck at exit in torch's gloo destructor", re.MULTILINE)


@dataclass(frozen=True, kw_only=True)
class Script:
    name: str
    args: tuple[str, ...] = ()
    module: bool = False
    nproc: int = 2
    kill: str = "1:2"  # rank:step at which a killed run SIGKILLs a rank
    # ftrun judges hangs by the `step N` lines the script prints (--progress-regex), as a user
    # of a script that knows nothing of ftrun would ask it to.
    progress: bool = False

    @property
    def entry(self) -> list[str]:
        return ["-m", self.name, *self.args] if self.module else [f"{self.name}.py", *self.args]


CORPUS = (
    Script(name="ddp_no_destroy", args=("--steps", "12"), kill="1:5"),
    Script(name="ddp_destroy"),
    Script(name="conf_module", module=True, args=("a", "--flag")),
    Script(name="argparse_guard", args=("--lr", "3e-4", "--tag", "x y")),
    Script(name="dataloader_workers", kill="1:1"),
    Script(name="multiprocessing_pools"),
    Script(name="exit_three"),
    Script(name="uncaught"),
    Script(name="record_errors"),
    Script(name="fsdp2_shard"),
    Script(name="nondaemon_thread"),
    Script(name="eval_pause", progress=True, kill="1:7"),
    Script(name="final_save", progress=True, kill="1:5"),
    Script(name="accum_ckpt", progress=True, kill="1:8"),
)
PROGRESS_REGEX = r"^step (\d+)$"


@dataclass
class Outcome:
    mode: str
    exit_code: int | None  # None: it hung (did not end within the deadline)
    conf: dict[int, list[str]] = field(default_factory=dict)
    traceback: list[str] = field(default_factory=list)
    output: str = ""
    seconds: float = 0.0

    @property
    def hung(self) -> bool:
        return self.exit_code is None

    @property
    def stalled(self) -> bool:
        """A rank of ftrun's stayed after the script's work was done, until the exit barrier
        killed it (plain torchrun has no barrier: a rank that stays there is a hang)."""
        return self.mode != "torchrun" and bool(EXIT_STALL.search(self.output))

    @property
    def raced(self) -> bool:
        """A rank of ftrun's met torch's gloo deadlock at exit and was ended by evidence."""
        return self.mode != "torchrun" and bool(EXIT_RACE.search(self.output))

    @property
    def finalization_abort(self) -> bool:
        """A rank did all its work (its last CONF line is out) and then met torch's abort at
        interpreter exit (FINALIZATION_ABORT)."""
        return self.exit_code not in (0, None) and FINALIZATION_ABORT in self.output

    def comparable(self) -> tuple[object, ...]:
        return (self.exit_code, self.conf, self.traceback)


def command(mode: str, script: Script, *, killed: bool, run_dir: Path) -> list[str]:
    restarts = "1" if killed else "0"
    nproc = str(script.nproc)
    if mode == "torchrun":
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            nproc,
            "--max-restarts",
            restarts,
            "--monitor-interval",
            "0.1",
            "--log-dir",
            str(run_dir / "torchrun"),
            *script.entry,
        ]
    start = "--warm-start" if mode == "warm" else "--cold-start"
    return [
        sys.executable,
        "-m",
        "ftrun",
        "launch",
        start,
        "--nproc-per-node",
        nproc,
        "--max-restarts",
        restarts,
        "--run-dir",
        str(run_dir),
        *(("--progress-regex", PROGRESS_REGEX) if script.progress else ()),
        *script.entry,
    ]


def run_one(
    mode: str,
    script: Script,
    *,
    killed: bool,
    timeout_s: float = 120,
    extra_env: dict[str, str] | None = None,
) -> Outcome:
    """One run of one script in one mode, in a scratch directory that is removed after."""
    scratch = Path(tempfile.mkdtemp(prefix="ftrun-conformance-"))
    tag = uuid.uuid4().hex
    env = {
        **os.environ,
        "CONF_DIR": str(scratch),
        "CONF_RUN_TAG": tag,
        "PYTHONUNBUFFERED": "1",
        "TMPDIR": str(scratch),
        **(extra_env or {}),
    }
    if killed:
        env["CONF_KILL"] = script.kill
    t0 = time.monotonic()
    proc = subprocess.Popen(
        command(mode, script, killed=killed, run_dir=scratch / "runs"),
        cwd=HERE,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        out, code = _stop(proc), None
    finally:
        _sweep(tag)
        shutil.rmtree(scratch, ignore_errors=True)
    printed = rank_output(mode, out)
    return Outcome(
        mode, code, conf_lines(printed), first_traceback(printed), out, time.monotonic() - t0
    )


def rank_output(mode: str, output: str) -> str:
    """What the ranks printed. ftrun prefixes each rank line with `[rankN]: ` on its console and
    adds its own lines (a failure summary quotes the rank's log tail): keep only rank lines.
    Plain torchrun passes the ranks' output through as it is."""
    if mode == "torchrun":
        return output
    return "\n".join(
        RANK_PREFIX.sub("", line, count=1)
        for line in output.splitlines()
        if RANK_PREFIX.match(line)
    )


def conf_lines(output: str) -> dict[int, list[str]]:
    """Each rank's CONF lines from its last attempt."""
    found: dict[int, list[tuple[int, str]]] = {}
    for line in output.splitlines():
        m = CONF_LINE.search(_strip_prefixes(line))
        if m:
            found.setdefault(int(m.group(1)), []).append((int(m.group(2)), m.group(3)))
    last = {}
    for rank, items in found.items():
        top = max(a for a, _ in items)
        last[rank] = [text for a, text in items if a == top]
    return dict(sorted(last.items()))


def first_traceback(output: str) -> list[str]:
    """The first Python traceback raised by a corpus script's own code (its last frame is in
    the script), as lines without the launchers' rank prefixes. Tracebacks of the other ranks,
    which fail in a collective when their peer dies, depend on timing and are left out."""
    lines = [_strip_prefixes(line) for line in output.splitlines()]
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last):"):
            block = [line]
            for nxt in lines[i + 1 :]:
                block.append(nxt)
                if nxt and not nxt.startswith((" ", "\t")):
                    break
            frames = [b for b in block if b.startswith('  File "')]
            if frames and str(HERE) in frames[-1]:
                return block
    return []


def _strip_prefixes(line: str) -> str:
    """ftrun's console prefix and torch.distributed's excepthook prefix, both `[rankN]: `."""
    while RANK_PREFIX.match(line):
        line = RANK_PREFIX.sub("", line, count=1)
    return line


def compare(outcomes: list[Outcome], *, killed: bool) -> tuple[list[str], list[str]]:
    """(ftrun's differences from the reference, plain torchrun's own failures), one line each.

    Unkilled runs are compared with plain torchrun. Killed runs are compared with cold ftrun:
    plain torchrun's restart (`--max-restarts 1`) is itself unreliable here (its new workers'
    gloo connect is refused or hangs in some trials), so its killed runs are reported apart,
    as the anchor's own failures, never counted against ftrun."""
    by_mode = {o.mode: o for o in outcomes}
    reference = by_mode.get("cold" if killed else "torchrun")  # None: no comparison, only
    problems: list[str] = []  # hangs and exit stalls (scripts/conformance.py --modes warm)
    for o in outcomes:
        if o.stalled:
            problems.append(f"{o.mode}: exit stall (a rank stayed until the exit barrier)")
        if o.hung and (o.mode != "torchrun" or not killed):
            problems.append(f"{o.mode}: hung (no exit within the deadline)")
        elif (
            reference is not None
            and o is not reference
            and not reference.hung
            and not (killed and o.mode == "torchrun")
            and o.comparable() != reference.comparable()
        ):
            for label, mine, theirs in (
                ("exit code", o.exit_code, reference.exit_code),
                ("CONF lines", o.conf, reference.conf),
                ("traceback", o.traceback, reference.traceback),
            ):
                if mine != theirs:
                    problems.append(f"{o.mode}: {label} {mine!r} != {reference.mode}'s {theirs!r}")
    anchor: list[str] = []
    torchrun = by_mode.get("torchrun")
    if (
        killed
        and torchrun is not None
        and reference is not None
        and torchrun.comparable() != reference.comparable()
    ):
        anchor.append(
            "torchrun: hung"
            if torchrun.hung
            else f"torchrun: exit {torchrun.exit_code}, did not recover as ftrun did"
        )
    return problems, anchor


def _stop(proc: subprocess.Popen[str]) -> str:
    """A hung launcher: Ctrl-C (ftrun then tears its job down), then SIGKILL."""
    for sig, wait_s in ((signal.SIGINT, 20.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            out, _ = proc.communicate(timeout=wait_s)
            return out
        except subprocess.TimeoutExpired:
            continue
    return ""


def _sweep(tag: str) -> None:
    """Kill anything of this run still alive (a hung rank of plain torchrun, say)."""
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("CONF_RUN_TAG") == tag:
                proc.kill()
        except (psutil.Error, OSError):
            continue
