"""The batch script `ftrun sbatch` submits: parsed inputs in, script text out, no I/O.

Pure so that a golden file can pin every line (tests/golden/, as submitit does for its sbatch
string): the paths, the interpreter and the job id are fields, never read from the machine here.
What each line is for is written into the script itself and in docs/slurm.md.

Slurm reads `#SBATCH` lines up to the first command, splitting them as a shell would (quotes and
backslashes, an unquoted `#` starts a comment), so every value is `shlex.quote`d there as on the
`exec` line.
"""

from __future__ import annotations

import re
import shlex
import signal
from dataclasses import dataclass
from pathlib import Path

from ftrun.config import UNFORWARDABLE_SIGNALS, signal_name

DEFAULT_SIGNAL = "USR2@90"
# Of the notice the signal gives before the time limit, what the controller keeps for itself
# (stop the ranks, write the journal, requeue): at most this, and at most half the notice.
PREEMPT_MARGIN_S = 15
# Slurm's own limit on the seconds of --signal (a 16-bit field).
MAX_SIGNAL_SECONDS = 0xFFFF
TIME_FORMATS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class PreemptSignal:
    """`--signal [B:]NAME@SECONDS`: which signal the controller gets, how long before the end."""

    name: str  # SIGUSR2
    seconds: int

    @property
    def slurm(self) -> str:
        """As `#SBATCH --signal` takes it: B: sends it to the batch step (the controller) only."""
        return f"B:{self.name.removeprefix('SIG')}@{self.seconds}"

    @property
    def grace_s(self) -> int:
        """What the ranks get to checkpoint and exit: the notice less the controller's margin."""
        return self.seconds - min(PREEMPT_MARGIN_S, self.seconds // 2)


def parse_signal(text: str, problems: list[str]) -> PreemptSignal:
    """USR2@90, SIGUSR2@90, usr2@90, B:USR2@90 → PreemptSignal; problems are collected."""
    spec = text.strip()
    body = spec[2:] if spec[:2].upper() == "B:" else spec
    name, at, seconds = body.partition("@")
    fallback = PreemptSignal("SIGUSR2", 90)
    if not at or not name or not seconds.isdigit():
        problems.append(f"--signal must be [B:]NAME@SECONDS, e.g. {DEFAULT_SIGNAL} (got {text!r})")
        return fallback
    sig = signal_name(name)
    if sig not in signal.Signals.__members__ or sig in UNFORWARDABLE_SIGNALS:
        why = "no such signal" if sig not in signal.Signals.__members__ else "ftrun keeps it"
        problems.append(f"--signal cannot send {name.strip()!r} ({why}); use e.g. USR1 or USR2")
        return fallback
    if not 0 < int(seconds) <= MAX_SIGNAL_SECONDS:
        problems.append(f"--signal seconds must be in 1..{MAX_SIGNAL_SECONDS} (got {seconds})")
        return fallback
    return PreemptSignal(sig, int(seconds))


def parse_time(text: str, problems: list[str]) -> int | None:
    """A Slurm time limit → seconds (0: no limit); None with a problem when malformed."""
    match = _TIME.fullmatch(text.strip())
    if match is None:
        problems.append(f"--time must be {TIME_FORMATS} (got {text!r})")
        return None
    days, first, second, third = match.groups()
    parts = [int(p) for p in (first, second, third) if p is not None]
    if days is not None:  # D-HH[:MM[:SS]]
        hours, minutes, secs = (parts + [0, 0])[:3]
        return ((int(days) * 24 + hours) * 60 + minutes) * 60 + secs
    if len(parts) == 3:  # HH:MM:SS
        return (parts[0] * 60 + parts[1]) * 60 + parts[2]
    minutes, secs = (parts + [0])[:2]  # MM or MM:SS
    return minutes * 60 + secs


@dataclass(frozen=True, kw_only=True)
class BatchScript:
    """Everything the script says; `render()` writes it. Paths are as they will be used."""

    job_id: str
    job_name: str
    run_dir: Path
    cwd: str  # the submission's working directory: --chdir, so SCRIPT resolves as typed
    python: str  # the interpreter that runs `ftrun launch` on the first node
    script: str
    script_args: tuple[str, ...] = ()
    nodes: int = 1
    spares: int = 0
    time: str | None = None
    partition: str | None = None
    gpus_per_node: int | None = None
    signal: PreemptSignal = PreemptSignal("SIGUSR2", 90)
    requeue: bool = True
    # Nodes earlier jobs quarantined (ftrun/quarantine.py): --exclude, ahead of the raw options.
    exclude: tuple[str, ...] = ()
    sbatch_args: tuple[str, ...] = ()  # raw #SBATCH options, written as given, last
    launch_args: tuple[str, ...] = ()  # `ftrun launch` flags passed on (launch_options.argv)

    @property
    def job_dir(self) -> Path:
        return self.run_dir / self.job_id

    @property
    def path(self) -> Path:
        return self.job_dir / "sbatch.sh"

    def launch_command(self) -> list[str]:
        """The one step: the controller, with what only the batch script knows."""
        return [
            self.python,
            "-m",
            "ftrun",
            "launch",
            "--slurm",
            "--job-id",
            self.job_id,
            "--job-name",
            self.job_name,
            "--run-dir",
            str(self.run_dir),
            "--slurm-spares",
            str(self.spares),
            "--preempt-signal",
            self.signal.name,
            "--preempt-grace",
            str(self.signal.grace_s),
            "--requeue" if self.requeue else "--no-requeue",
            *self.launch_args,
            "--",
            self.script,
            *self.script_args,
        ]

    def directives(self) -> list[tuple[str, str]]:
        """(comment, option) pairs for the #SBATCH block; an empty comment is none."""
        nodes = (
            f"{_count(self.nodes, 'training node')} + {_count(self.spares, 'hot spare')}"
            if self.spares
            else f"{_count(self.nodes, 'training node')}, no spare"
        )
        out = [
            ("", f"--job-name={self.job_name}"),
            (nodes, f"--nodes={self.nodes + self.spares}"),
            ("one ftrun agent per node; it starts the node's ranks", "--ntasks-per-node=1"),
        ]
        if self.gpus_per_node is not None:
            out.append(("", f"--gpus-per-node={self.gpus_per_node}"))
        if self.time is not None:
            out.append(("", f"--time={self.time}"))
        if self.partition is not None:
            out.append(("", f"--partition={self.partition}"))
        if self.exclude:
            out.append((
                "quarantined by earlier jobs: `ftrun hosts --quarantined`",
                f"--exclude={','.join(self.exclude)}",
            ))  # fmt: skip
        out += [
            ("a failed node must not end the allocation: ftrun replaces it", "--no-kill"),
            (
                "the job may go back in the queue and start again, as the same ftrun job"
                if self.requeue
                else "the job is never requeued: it ends where it stops",
                "--requeue" if self.requeue else "--no-requeue",
            ),
            (
                f"{self.signal.name} to the controller only (B:) {self.signal.seconds} s before "
                f"the time limit; the ranks get {self.signal.grace_s} s to checkpoint",
                f"--signal={self.signal.slurm}",
            ),
            (
                "output into the job directory, kept across requeues",
                f"--output={self.job_dir / 'slurm-%j.out'}",
            ),
            ("", "--open-mode=append"),
            (
                "run where `ftrun sbatch` ran, so SCRIPT and relative paths resolve",
                f"--chdir={self.cwd}",
            ),
        ]
        return out

    def line_breakers(self) -> list[str]:
        """What the user gave that holds a line break or another control character, each named
        as the user knows it. In the #SBATCH block a newline ends the quoted line, and the next
        line of the script would run as a command (issue 34): such a script is never written."""
        given = {
            "--job-name": [self.job_name],
            "--partition": [self.partition or ""],
            "--time": [self.time or ""],
            "--sbatch-arg": list(self.sbatch_args),
            "the quarantine store's nodes": list(self.exclude),
            "the current directory's path": [self.cwd],
            "the run directory's path": [str(self.run_dir)],
            "the Python interpreter's path": [self.python],
            "SCRIPT": [self.script],
            "the script's arguments": list(self.script_args),
            "the launch options": list(self.launch_args),
        }
        return [what for what, texts in given.items() if any(_CONTROL.search(t) for t in texts)]

    def render(self) -> str:
        if broken := self.line_breakers():  # the CLI refused it first, with the names
            raise ValueError(f"control characters in {', '.join(broken)}")
        lines = [
            "#!/bin/bash",
            f"# Written by `ftrun sbatch` for ftrun job {self.job_id}.",
        ]
        for comment, option in self.directives():
            if comment:
                lines.append(f"# {comment}")
            lines.append(f"#SBATCH {_quote_option(option)}")
        if self.sbatch_args:
            lines.append("# --sbatch-arg, as given (last: an option given twice, the last wins)")
            lines += [f"#SBATCH {arg}" for arg in self.sbatch_args]
        lines += [
            "",
            "# No --export: sbatch's default (ALL) carries the submitting shell's environment",
            "# (virtualenv, PYTHONPATH, FTRUN_*, NCCL_*...) into the job as it was.",
            "# The one step is the ftrun controller, exec'ed so that Slurm's signal reaches it",
            "# directly (bash would hold a trap until its child exits); it starts an agent on",
            "# every node with srun and supervises the ranks.",
            *_continued(self.launch_command()),
            "",
        ]
        return "\n".join(lines)


def _continued(command: list[str]) -> list[str]:
    """`exec` the command, one flag (and its value) per line, the script and its args last."""
    split = command.index("--")
    groups: list[list[str]] = [["exec", *command[:4]]]  # exec python -m ftrun launch
    for word in command[4:split]:
        if word.startswith("-"):
            groups.append([])
        groups[-1].append(word)
    groups.append(command[split:])
    return [
        ("    " if i else "") + shlex.join(g) + (" \\" if i < len(groups) - 1 else "")
        for i, g in enumerate(groups)
    ]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _quote_option(option: str) -> str:
    """--name=value with the value quoted as Slurm's #SBATCH parser (shell-like) expects."""
    name, eq, value = option.partition("=")
    return f"{name}={shlex.quote(value)}" if eq else option
