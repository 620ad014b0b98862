"""Reading a job directory back: the events of events.jsonl (status, inspect, a resumed job),
where a resumed job goes on from, and finding job directories in the run directory.

The journal is read by people's commands, and they must work on any file: a line that is not
UTF-8, not JSON or not an event (journal_schema.py) is skipped and counted, and the job is
shown as damaged; a torn last line is what every crash of the writer leaves, and is not damage,
nor is the torn line a resumed controller closed before its own `job_started`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ftrun.errors import UsageError
from ftrun.journal import EVENTS_FILE
from ftrun.journal_schema import event_problem

# One event is a few KiB (a traceback, a rank's stacks); a line past this is not one of ftrun's,
# and is skipped without being held in memory whole.
MAX_EVENT_BYTES = 16 << 20


@dataclass(frozen=True)
class JournalRead:
    """A journal as read: its well-formed events, and how many lines were not (not UTF-8, not
    JSON, not an event: see journal_schema.py), with the first few reasons. A torn last line
    (a controller killed mid-write) is not damage: it is what every crash leaves."""

    events: list[dict[str, Any]]
    bad_lines: int = 0
    problems: tuple[str, ...] = ()

    @property
    def damage(self) -> str | None:
        """`3 bad lines in events.jsonl (line 2: ...)`, or None for a sound journal."""
        if not self.bad_lines:
            return None
        plural = "s" if self.bad_lines != 1 else ""
        return f"{self.bad_lines} bad line{plural} in {EVENTS_FILE} ({'; '.join(self.problems)})"


def read_events(job_dir: Path) -> list[dict[str, Any]]:
    """The job's well-formed events; bad lines are skipped (read_journal counts them)."""
    return read_journal(job_dir).events


def read_journal(job_dir: Path) -> JournalRead:
    try:
        with open(job_dir / EVENTS_FILE, "rb") as f:
            return _parse(f)
    except FileNotFoundError:
        return JournalRead([])
    except OSError as e:  # not a directory, not readable
        raise UsageError(
            f"cannot read the journal of {job_dir}: {e.strerror or e}",
            hint="check the run directory (--run-dir) and its permissions",
        ) from None


def _parse(f: IO[bytes]) -> JournalRead:
    events: list[dict[str, Any]] = []
    bad = 0
    problems: list[str] = []
    number = 0
    torn: str | None = None  # a bad line held back: a torn line closed by a resume is not damage
    while True:
        line = f.readline(MAX_EVENT_BYTES)
        if not line:
            break
        number += 1
        if not line.strip():
            continue
        problem: str | None
        if len(line) == MAX_EVENT_BYTES and not line.endswith(b"\n"):
            while (more := f.readline(MAX_EVENT_BYTES)) and not more.endswith(b"\n"):
                pass  # the rest of an oversized line, read and dropped a piece at a time
            problem = f"longer than {MAX_EVENT_BYTES >> 20} MiB"
        else:
            event, problem = _event(line)
            if event is not None:
                if torn is not None and event.get("kind") != "job_started":
                    bad, problems = _count(bad, problems, torn)
                torn = None  # a line a killed writer tore, closed by the controller resuming
                events.append(event)
                continue
            if problem in ("torn", "not UTF-8") and not line.endswith(b"\n"):
                continue  # a torn last line (the only one without a newline): a killed writer
            if problem in ("torn", "not UTF-8") and torn is None:
                torn = f"line {number}: {'not JSON' if problem == 'torn' else problem}"
                continue  # damage, unless a resumed controller's job_started comes next
            if problem == "torn":
                problem = "not JSON"
        bad, problems = _count(bad, problems, f"line {number}: {problem}")
    if torn is not None:
        bad, problems = _count(bad, problems, torn)
    return JournalRead(events, bad, tuple(problems))


def _count(bad: int, problems: list[str], problem: str) -> tuple[int, list[str]]:
    return bad + 1, problems + [problem] if len(problems) < 3 else problems


def _event(line: bytes) -> tuple[dict[str, Any] | None, str | None]:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8"
    try:
        event = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, RecursionError):
        return None, "torn"
    problem = event_problem(event)
    return (event, None) if problem is None else (None, problem)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number an event holds")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value


@dataclass(frozen=True)
class ResumePoint:
    """Where a job that is resumed (requeued) left off, from its journal: its numbering goes
    on (generations, incidents, restarts used) and the incident that stopped it is closed by
    the first generation that steps again."""

    generation: int = 0
    incidents: int = 0
    restarts: int = 0  # charged to --max-restarts
    finished: str | None = None  # the last run's end state; None: its controller died
    open_incident: int | None = None  # the preemption (or other) incident to resume from
    runs: int = 0  # how many controllers ran the job before
    slurm_restart_count: int = 0  # the last run's SLURM_RESTART_COUNT
    controller: tuple[int | None, float | None] = (None, None)  # the last run's (pid, start)
    last_t: float | None = None  # the journal's last event: about when a dead controller died
    last_step: int | None = None  # the newest step the journal saw
    running: int | None = None  # a generation launched and never ended (its controller died)
    replacements: int = 0  # restarts after a lost host, not charged

    @property
    def resumable(self) -> bool:
        """A job that succeeded, failed for good or was stopped by hand is not resumed."""
        return self.finished in (None, "preempted", "requeued")


# Events whose `step` is a step the ranks reached.
STEP_KINDS = ("first_step", "progress", "generation_ended", "checkpoint_committed")


def resume_point(events: list[dict[str, Any]]) -> ResumePoint:
    generation = incidents = restarts = runs = slurm_restarts = 0
    finished: str | None = None
    last_incident: int | None = None
    controller: tuple[int | None, float | None] = (None, None)
    last_t: float | None = None
    last_step: int | None = None
    running: int | None = None
    replacements = 0
    for ev in events:
        kind = ev.get("kind")
        if isinstance(ev.get("t"), (int, float)):
            last_t = float(ev["t"])
        if isinstance(ev.get("step"), int) and kind in STEP_KINDS:
            last_step = max(last_step or 0, ev["step"])
        if kind == "job_started":
            runs += 1
            finished = None
            slurm_restarts = int(ev.get("slurm_restart_count") or 0)
            controller = (ev.get("controller_pid"), ev.get("controller_create_time"))
        elif kind == "generation_launched" and isinstance(ev.get("gen"), int):
            generation = max(generation, ev["gen"])
            running = ev["gen"]
        elif kind == "generation_ended" and ev.get("gen") == running:
            running = None
        elif kind == "fault_detected" and isinstance(ev.get("incident"), int):
            incidents = max(incidents, ev["incident"])
            last_incident = ev["incident"]
        elif kind == "restart":
            if ev.get("charged", True):  # journals before the field: every restart was charged
                restarts += 1
            else:
                replacements += 1
            last_incident = None  # relaunched: closed
        elif kind == "resumed":
            last_incident = None
        elif kind == "job_finished":
            finished = str(ev.get("state"))
    return ResumePoint(
        generation,
        incidents,
        restarts,
        finished,
        last_incident,
        runs,
        slurm_restarts,
        controller,
        last_t,
        last_step,
        running if finished is None else None,
        replacements,
    )


def check_run_dir_path(run_dir: Path) -> None:
    """A run directory (or one to be made) whose path runs into a file is a mistake to name
    plainly (`FTRUN_RUN_DIR=/etc/passwd`), not a "File exists" or an empty listing."""
    for part in (run_dir, *run_dir.parents):
        if part.exists() and not part.is_dir():
            what = "is" if part == run_dir else f"is inside {part}, which is"
            raise UsageError(
                f"the run directory {run_dir} {what} a file, not a directory",
                hint="pass a directory to --run-dir or FTRUN_RUN_DIR (default ~/.ftrun/runs)",
            )
        if part.exists():
            return


def list_job_dirs(run_dir: Path) -> list[Path]:
    check_run_dir_path(run_dir)
    if not run_dir.is_dir():
        return []
    try:
        return [p for p in run_dir.iterdir() if (p / EVENTS_FILE).is_file()]
    except OSError as e:
        raise UsageError(
            f"cannot list the run directory {run_dir}: {e.strerror or e}",
            hint="check the run directory (--run-dir) and its permissions",
        ) from None


def find_job_dir(run_dir: Path, job: str) -> Path:
    """A job by exact id, or by a prefix that names exactly one job."""
    check_run_dir_path(run_dir)
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
