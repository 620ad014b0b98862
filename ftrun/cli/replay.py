"""`ftrun replay TRACE -- LAUNCH ARGS`: a real job on real hosts, following an availability trace.

The job is an ordinary `ftrun launch` (the arguments after `--`), started on the hosts the trace
has up at its start, with `--max-nodes` the most it ever has up. Then, with the trace's times
multiplied by --time-scale:
  remove  runs --on-remove for the host: it must kill every process of the host without
          warning, as a spot reclaim does (on the testbed: `scripts/testbed.sh kill {host}`);
  add     runs --on-add (power it on: `scripts/testbed.sh start {host}`), then
          `ftrun hosts JOB add HOST`, as a user or an autoscaler would.
The job is stopped (SIGINT, as Ctrl-C) --tail seconds after the trace's last event, and the
goodput read from its journal is printed, with the badput buckets: the measurement that
`ftrun simulate` is checked against.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import typer
from rich.text import Text

from ftrun.cli import job_options
from ftrun.cli.control import ask
from ftrun.cli.goodput_render import goodput_table, ratio_text
from ftrun.cli.render import make_console
from ftrun.config import resolve_run_dir
from ftrun.errors import FtrunError, UsageError
from ftrun.jobview import load_job
from ftrun.jobview.goodput import job_goodput
from ftrun.journal.read import find_job_dir, read_journal
from ftrun.sim.trace import Trace, TraceEvent, read_trace

console = make_console()
JOB_DIR_TIMEOUT_S = 60.0  # `ftrun launch` makes its job directory at once
ACTION_TIMEOUT_S = 60.0  # an --on-remove / --on-add command
STOP_TIMEOUT_S = 120.0  # the job's graceful stop after the SIGINT


def replay(
    trace: Path = typer.Argument(..., help="An availability trace: t_ms,add|remove,node lines."),
    launch_args: list[str] = typer.Argument(
        ..., help="What `ftrun launch` takes (after --): options, then the script and its args."
    ),
    time_scale: float = typer.Option(
        1.0, "--time-scale", help="Multiply the trace's times by this (0.1: ten times faster)."
    ),
    on_remove: str = typer.Option(
        ..., "--on-remove", help="Command that kills every process of {host} (a spot reclaim)."
    ),
    on_add: str = typer.Option(
        ..., "--on-add", help="Command that brings {host} back up before it is added."
    ),
    host_map: str | None = typer.Option(
        None, "--map", help="Trace node → host: node1=hostA,node2=hostB [default: same names]."
    ),
    tail: float = typer.Option(
        60.0, "--tail", help="Seconds (trace time) the job runs after the trace's last event."
    ),
    run_dir: Path | None = job_options.RUN_DIR,
) -> None:
    """Run a real job while following an availability trace: hosts killed and added on cue;
    goodput and its badput buckets at the end."""
    problems: list[str] = []
    if not 0 < time_scale <= 1e6:
        problems.append(f"--time-scale must be more than 0 (got {time_scale:g})")
    if not 0 <= tail <= 1e9:
        problems.append(f"--tail must be 0 or more (got {tail:g})")
    for name, command in (("--on-remove", on_remove), ("--on-add", on_add)):
        if "{host}" not in command:
            problems.append(f"{name} must name the host as {{host}}: {command!r}")
    for flag in ("--hosts", "--hostfile", "--max-nodes", "--job-name", "--run-dir"):
        if any(a == flag or a.startswith(flag + "=") for a in launch_args):
            problems.append(f"{flag} is replay's to set: leave it out of the launch arguments")
    mapping = _mapping(host_map, problems)
    if problems:
        raise UsageError("; ".join(problems), hint="see `ftrun replay --help`")
    events = read_trace(trace).scaled(time_scale)
    if too_long := events.span_problem(tail * time_scale):
        raise UsageError(too_long, hint="give a shorter trace or a smaller --time-scale")
    hosts = [mapping.get(n, n) for n in events.up_at(0.0)]
    if not hosts:
        raise UsageError(f"{trace} has no host up at its start", hint="replay starts the job then")
    runs = resolve_run_dir(run_dir)
    name = f"replay-{trace.stem[:32]}-{uuid.uuid4().hex[:6]}"
    argv = [
        sys.executable, "-m", "ftrun", "launch", "--run-dir", str(runs), "--job-name", name,
        "--hosts", ",".join(hosts), "--max-nodes", str(events.most_up()), *launch_args,
    ]  # fmt: skip
    for node in events.up_at(0.0):  # the trace's start: its hosts up, as any add makes them
        _run(on_add, mapping.get(node, node), f"t=0 add {mapping.get(node, node)}")
    console.print(Text(f"replay: {shlex.join(argv[3:])}", style="dim"), soft_wrap=True)
    launcher = subprocess.Popen(argv, start_new_session=True)
    try:
        job_dir = _job_dir(runs, name, launcher)
        # The trace's time 0 is the job's start as its journal has it (what goodput counts
        # from), not our launching it: the launcher's own start-up is nobody's wall time.
        origin = time.monotonic() - (time.time() - _started_t(job_dir, launcher))
        _follow(events, origin, job_dir, launcher, mapping, on_remove, on_add, tail * time_scale)
        _stop(launcher)
    finally:
        if launcher.poll() is None:  # an error, or Ctrl-C: the job goes down with us
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait(timeout=30)
    _report(job_dir)


def _mapping(text: str | None, problems: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        node, sep, host = item.partition("=")
        if not sep or not node.strip() or not host.strip():
            problems.append(f"--map: {item!r} is not node=host")
            continue
        out[node.strip()] = host.strip()
    return out


def _job_dir(runs: Path, name: str, launcher: subprocess.Popen[bytes]) -> Path:
    deadline = time.monotonic() + JOB_DIR_TIMEOUT_S
    while time.monotonic() < deadline:
        if launcher.poll() is not None:
            raise FtrunError(
                f"`ftrun launch` exited {launcher.returncode} before the trace began",
                hint="its message is above",
            )
        try:
            return find_job_dir(runs, name)
        except UsageError:
            time.sleep(0.1)
    raise FtrunError(f"no job directory {runs}/{name}-* after {JOB_DIR_TIMEOUT_S:g} s")


def _started_t(job_dir: Path, launcher: subprocess.Popen[bytes]) -> float:
    deadline = time.monotonic() + JOB_DIR_TIMEOUT_S
    while time.monotonic() < deadline and launcher.poll() is None:
        try:
            events = read_journal(job_dir).events
        except UsageError:
            events = []
        for ev in events:
            if ev["kind"] == "job_started":
                return float(ev["t"])
        time.sleep(0.05)
    raise FtrunError(f"job {job_dir.name} did not start", hint="its message is above")


def _follow(
    trace: Trace,
    origin: float,
    job_dir: Path,
    launcher: subprocess.Popen[bytes],
    mapping: dict[str, str],
    on_remove: str,
    on_add: str,
    tail_s: float,
) -> None:
    """Each event of the trace after its start, on time; returns at its end plus the tail."""
    for event in [e for e in trace.events if e.t_s > 0]:
        if not _wait_until(origin + event.t_s, launcher):
            return
        host = mapping.get(event.node, event.node)
        _act(event, host, on_remove if event.action == "remove" else on_add, job_dir)
    _wait_until(origin + trace.duration_s + tail_s, launcher)


def _wait_until(t: float, launcher: subprocess.Popen[bytes]) -> bool:
    """False when the job ended first."""
    while (left := t - time.monotonic()) > 0:
        try:
            launcher.wait(timeout=min(left, 0.5))
            return False
        except subprocess.TimeoutExpired:
            continue
    return launcher.poll() is None


def _act(event: TraceEvent, host: str, template: str, job_dir: Path) -> None:
    _run(template, host, f"t={event.t_s:.1f}s {event.action} {host}")
    if event.action == "add":
        ok, message = ask(job_dir, "hosts", "hosts_ack", action="add", host=host)
        console.print(f"replay: hosts add {host}: {message}", soft_wrap=True)


def _run(template: str, host: str, what: str) -> None:
    command = template.replace("{host}", shlex.quote(host))
    console.print(f"replay: {what}: {command}", soft_wrap=True)
    try:
        done = subprocess.run(
            command, shell=True, timeout=ACTION_TIMEOUT_S, capture_output=True, text=True
        )
    except subprocess.TimeoutExpired:
        raise FtrunError(
            f"`{command}` took more than {ACTION_TIMEOUT_S:g} s", hint="check the command"
        ) from None
    if done.returncode != 0:
        raise FtrunError(
            f"`{command}` exited {done.returncode}: {done.stderr.strip()[-500:]}",
            hint="check --on-remove / --on-add",
        )


def _stop(launcher: subprocess.Popen[bytes]) -> None:
    if launcher.poll() is not None:
        return
    os.killpg(launcher.pid, signal.SIGINT)  # as Ctrl-C: a graceful stop, the journal closed
    try:
        launcher.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise FtrunError(f"the job did not stop within {STOP_TIMEOUT_S:g} s of SIGINT") from None


def _report(job_dir: Path) -> None:
    view = load_job(job_dir)
    report = job_goodput(view)
    console.print()
    console.print(
        Text.assemble(
            (f"replay of {job_dir.name}: ", "bold"),
            f"{len(view.incidents)} incident(s), {len(view.generations)} generation(s); goodput ",
            (ratio_text(report.job), "bold green"),
        )
    )
    console.print(goodput_table(report))
    console.print(Text(f"see `ftrun inspect {job_dir.name}`", style="dim"))


def register(app: typer.Typer) -> None:
    app.command()(replay)  # replay's options anywhere; what follows -- is launch's
