"""The job directory on disk: resolved config, the append-only event log, and per-rank logs.

    <run dir>/<job id>/config.json
    <run dir>/<job id>/events.jsonl          one JSON event per line, flushed per event
    <run dir>/<job id>/logs/g<G>/rank<R>.log  what rank R printed in generation G
    <run dir>/<job id>/logs/g<G>/<host>.torchrun.log

Only the controller writes here; `status` and `inspect` only read. A reader tolerates a torn last
line, because the controller may have been killed in the middle of writing it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ftrun import filemodes
from ftrun.errors import UsageError

EVENTS_FILE = "events.jsonl"
CONFIG_FILE = "config.json"


class Journal:
    """Appends events and log lines for one job. Not thread-safe: the controller's loop owns it."""

    def __init__(
        self, job_dir: Path, *, existing: bool = False, umask: int = filemodes.PRIVATE_UMASK
    ) -> None:
        """A new job directory, or with `existing` one made beforehand (by `ftrun sbatch`) or
        a job's own to resume (a requeued Slurm job): its events are appended to. One we
        create gets the mode `umask` allows (0700 by default), whatever the process umask."""
        self.job_dir = job_dir
        try:
            filemodes.make_dir(job_dir, umask, parents=True, exist_ok=existing)
            self._events = open(job_dir / EVENTS_FILE, "a", encoding="utf-8")
            if existing and self._events.tell() > 0 and not _ends_with_newline(job_dir):
                self._events.write("\n")  # a killed controller's torn last line stays apart
        except OSError as e:
            raise UsageError(
                f"cannot create the job directory {job_dir}: {e.strerror or e}",
                hint="pass a writable --run-dir or set FTRUN_RUN_DIR",
            ) from None
        self._logs: dict[tuple[int, str], IO[str]] = {}

    def write_config(self, config: dict[str, Any]) -> None:
        path = self.job_dir / CONFIG_FILE
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")

    def record(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"t": time.time(), "kind": kind, **fields}
        self._events.write(json.dumps(event, separators=(",", ":"), default=str) + "\n")
        self._events.flush()
        return event

    def log_path(self, generation: int, stream: str) -> Path:
        return self.job_dir / "logs" / f"g{generation}" / f"{stream}.log"

    def append_log(self, generation: int, stream: str, lines: Iterable[str]) -> None:
        key = (generation, stream)
        handle = self._logs.get(key)
        if handle is None:
            path = self.log_path(generation, stream)
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = self._logs[key] = open(path, "a", encoding="utf-8")
        handle.writelines(line + "\n" for line in lines)
        handle.flush()

    def close_generation_logs(self, generation: int) -> None:
        for key in [k for k in self._logs if k[0] == generation]:
            self._logs.pop(key).close()

    def close(self) -> None:
        for handle in self._logs.values():
            handle.close()
        self._logs.clear()
        if not self._events.closed:
            self._events.flush()
            os.fsync(self._events.fileno())
            self._events.close()


def _ends_with_newline(job_dir: Path) -> bool:
    with open(job_dir / EVENTS_FILE, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def read_events(job_dir: Path) -> list[dict[str, Any]]:
    events = []
    try:
        with open(job_dir / EVENTS_FILE, encoding="utf-8") as f:
            for line in f:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # a torn last line from a killed controller
                if isinstance(event, dict) and "kind" in event:
                    events.append(event)
    except FileNotFoundError:
        pass
    except OSError as e:  # not a directory, not readable
        raise UsageError(
            f"cannot read the journal of {job_dir}: {e.strerror or e}",
            hint="check the run directory (--run-dir) and its permissions",
        ) from None
    return events


@dataclass(frozen=True)
class ResumePoint:
    """Where a job that is resumed (requeued) left off, from its journal: its numbering goes
    on (generations, incidents, restarts used) and the incident that stopped it is closed by
    the first generation that steps again."""

    generation: int = 0
    incidents: int = 0
    restarts: int = 0
    finished: str | None = None  # the last run's end state; None: its controller died
    open_incident: int | None = None  # the preemption (or other) incident to resume from
    runs: int = 0  # how many controllers ran the job before
    slurm_restart_count: int = 0  # the last run's SLURM_RESTART_COUNT
    controller: tuple[int | None, float | None] = (None, None)  # the last run's (pid, start)

    @property
    def resumable(self) -> bool:
        """A job that succeeded, failed for good or was stopped by hand is not resumed."""
        return self.finished in (None, "preempted", "requeued")


def resume_point(events: list[dict[str, Any]]) -> ResumePoint:
    generation = incidents = restarts = runs = slurm_restarts = 0
    finished: str | None = None
    last_incident: int | None = None
    controller: tuple[int | None, float | None] = (None, None)
    for ev in events:
        kind = ev.get("kind")
        if kind == "job_started":
            runs += 1
            finished = None
            slurm_restarts = int(ev.get("slurm_restart_count") or 0)
            controller = (ev.get("controller_pid"), ev.get("controller_create_time"))
        elif kind == "generation_launched" and isinstance(ev.get("gen"), int):
            generation = max(generation, ev["gen"])
        elif kind == "fault_detected" and isinstance(ev.get("incident"), int):
            incidents = max(incidents, ev["incident"])
            last_incident = ev["incident"]
        elif kind == "restart":
            restarts += 1
            last_incident = None  # relaunched: closed
        elif kind == "resumed":
            last_incident = None
        elif kind == "job_finished":
            finished = str(ev.get("state"))
    return ResumePoint(
        generation, incidents, restarts, finished, last_incident, runs, slurm_restarts, controller
    )


def list_job_dirs(run_dir: Path) -> list[Path]:
    if not run_dir.is_dir():
        return []
    return [p for p in run_dir.iterdir() if (p / EVENTS_FILE).is_file()]


def find_job_dir(run_dir: Path, job: str) -> Path:
    """A job by exact id, or by a prefix that names exactly one job."""
    exact = run_dir / job
    if (exact / EVENTS_FILE).is_file():
        return exact
    matches = [p for p in list_job_dirs(run_dir) if p.name.startswith(job)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UsageError(
            f"no job {job!r} in {run_dir}",
            hint="`ftrun status` lists the jobs; pass --run-dir if it ran elsewhere",
        )
    names = ", ".join(sorted(p.name for p in matches)[:5])
    raise UsageError(f"{job!r} matches several jobs: {names}", hint="give more of the job id")
