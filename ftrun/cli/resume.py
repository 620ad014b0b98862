"""`ftrun resume JOB`: a new controller for a job whose controller died.

The machine or the process that ran `ftrun launch` is gone (SIGKILL, OOM, a reboot). Its agents
keep their ranks training for `--controller-grace` (60 s), dialling the controller's address.
`ftrun resume` starts a new controller from what the job directory keeps: the launch's own
settings (`config.json`), the fault policy, the journal (generation, incident and restart
numbering go on), and the checkpoints. Within the grace it listens where the old one did and
adopts the running generation when all its agents come back with it: no rank restarted, no step
lost (controller/adoption.py). After the grace, or when some did not come back, the next
generation restores from the freshest checkpoint. The outage is an incident of its own in the
journal ("controller-lost"), so `ftrun inspect` shows what it cost.

Values of `--env NAME=VALUE` are not kept in the job directory (they may be secrets): they are
read again from this shell's environment, and a missing one is an error that names it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer

from ftrun import envcontract, jobfiles
from ftrun.cli import job_options, launch, saved_launch
from ftrun.config import LaunchConfig, resolve_run_dir, standby_run_dir
from ftrun.controller.adoption import adoption_of
from ftrun.controller.policy_file import policy_from_dict
from ftrun.controller.resumption import StoodDown
from ftrun.errors import UsageError
from ftrun.jobfiles import JobDir
from ftrun.jobview.fold import controller_alive
from ftrun.journal import CONFIG_FILE, EVENTS_FILE
from ftrun.journal.read import ResumePoint, find_job_dir, read_events, resume_point
from ftrun.transport.registry import backend, options_from

# LaunchConfig fields that config.json holds as lists.
TUPLES = ("script_args", "hosts", "spares", "forward_signals")
# How long a resume by hand tries the standby's takeover address (a machine that lost power
# never answers: the attempt is cut short).
STANDBY_PROBE_S = 1.0


def resume(
    job: str = typer.Argument(..., help="A job id (or a unique prefix)."),
    run_dir: Path | None = job_options.RUN_DIR,
    lost_at: float | None = typer.Option(
        None,
        "--lost-at",
        hidden=True,
        help="A standby's takeover: when its agent took the primary for gone (Unix time).",
    ),
    takeover_port: int | None = typer.Option(
        None,
        "--takeover-port",
        hidden=True,
        help="A standby's takeover (agent/standby.py): listen on this port, where the agents "
        "dial the standby, and adopt only if most of them come.",
    ),
) -> None:
    """Start a new controller for a job whose controller died: it goes on from its freshest
    checkpoint, with the settings it was launched with."""
    job_dir = find_job_dir(resolve_run_dir(run_dir), job)
    # Another user's directory, or files they could have written, would run their script as
    # you: checked before anything in them is read (ftrun/jobfiles.py).
    with JobDir.open(job_dir, create=False) as files:
        what = "the job's journal"
        jobfiles.check_file(job_dir / EVENTS_FILE, files.lstat(EVENTS_FILE), what=what)
        saved = _saved_launch(files)
    events = read_events(job_dir)
    point = resume_point(events)
    pid = point.controller[0]
    # The old controller's pid is another machine's when a standby takes over.
    if takeover_port is None and controller_alive(*point.controller):
        raise UsageError(
            f"job {job_dir.name} is running: its controller is pid {pid}",
            hint=f"`ftrun status {job_dir.name}` shows it",
        )
    if not point.resumable:
        raise UsageError(
            f"job {job_dir.name} already ended ({point.finished}): there is nothing to resume",
            hint="start a new job with `ftrun launch`; it may restore from this job's "
            f"checkpoints (--ckpt-dir {job_dir / 'checkpoints'}, as your script takes it)",
        )
    if takeover_port is None and (leader := standby_leads(point)) is not None:
        raise UsageError(
            f"job {job_dir.name} was taken over by its standby controller on {leader}: it runs "
            "there, and a second controller would compete with it for the same ranks",
            hint=f"on {leader}: `ftrun status {job_dir.name} --run-dir "
            f"{standby_run_dir(job_dir.parent, leader)}`",
        )
    config = config_from_saved(saved, job_dir, os.environ)
    if (problem := backend(config.transport).resume_problem(job_dir.name)) is not None:
        raise UsageError(
            problem, hint="requeue its batch job (`scontrol requeue`): the batch step resumes it"
        )
    policy = policy_from_dict(saved.get("policy") or {}, where=f"{job_dir / CONFIG_FILE}")
    os.umask(config.umask)
    # Within the agents' grace, the running generation may still be alive: adopt it.
    adoption = adoption_of(config, point, events, now=time.time())
    if takeover_port is not None:
        if adoption is None:
            raise StoodDown(
                f"job {job_dir.name} has no generation this standby can adopt (none running, or "
                "past the agents' grace): standing down",
                hint="if its controller is gone for good, `ftrun resume` it by hand",
            )
        adoption = dataclasses.replace(adoption, port=takeover_port, takeover=True, lost_at=lost_at)
        # It runs on the standby host itself: no standby of its own (docs/standby.md).
        config = dataclasses.replace(config, standby=None)
    code = launch.run(config, policy, point, adoption)
    if code:
        raise typer.Exit(code)


def standby_leads(point: ResumePoint) -> str | None:
    """The standby's host, when its takeover controller listens where the agents dial it: the
    port the standby's agent picked for it, on which nothing else listens (agent/standby.py)."""
    if point.standby is None:
        return None
    host, addr, port = point.standby
    try:
        with socket.create_connection((addr, port), timeout=STANDBY_PROBE_S):
            return host
    except OSError:
        return None


def _saved_launch(files: JobDir) -> dict[str, Any]:
    path = files.path / CONFIG_FILE
    try:
        saved = json.loads(files.read(CONFIG_FILE, what="the job's settings").decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UsageError(
            f"cannot read the job's settings {path}: {getattr(e, 'strerror', None) or e}",
            hint="without them the job cannot be resumed; launch it again with its flags",
        ) from None
    if not isinstance(saved, dict):
        raise UsageError(f"{path} is not the job's settings", hint="launch the job again")
    wrong = saved_launch.problems(saved)
    if wrong:
        raise UsageError(
            f"{path} does not hold a launch's settings: " + "; ".join(wrong),
            hint="launch the job again with its flags",
        )
    return saved


def config_from_saved(
    saved: dict[str, Any], job_dir: Path, environ: Mapping[str, str]
) -> LaunchConfig:
    """The LaunchConfig a job was launched with, from its config.json; the values of its
    `--env` names and the forwarded environment from `environ`."""
    fields = {k: v for k, v in saved.items() if k in LaunchConfig.__dataclass_fields__}
    missing = [name for name in fields.get("env") or () if name not in environ]
    if missing:
        raise UsageError(
            f"the job's --env variable(s) {', '.join(missing)} are not set here: their values "
            "are not kept in the job directory",
            hint="export them (with the values the job had), then `ftrun resume` again",
        )
    fields["env"] = tuple((name, environ[name]) for name in fields.get("env") or ())
    fields["forward_env"] = tuple(envcontract.forwarded(environ).items())
    for name in TUPLES:
        if name in fields:
            fields[name] = tuple(fields[name])
    fields["run_dir"] = job_dir.parent
    fields["job_id"] = job_dir.name
    # Nested since issue 35; an ftrun of before wrote the same names flat (options.py).
    transport = str(saved.get("transport", "local"))
    fields["transport_options"] = options_from(transport, saved.get("transport_options") or saved)
    try:
        return LaunchConfig(**fields)
    except TypeError as e:
        raise UsageError(
            f"{job_dir / CONFIG_FILE} does not hold a launch's settings: {e}",
            hint="launch the job again with its flags",
        ) from None


def register(app: typer.Typer) -> None:
    app.command()(resume)
