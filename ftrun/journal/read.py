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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ftrun.errors import UsageError
from ftrun.journal import EVENTS_FILE
from ftrun.journal.schema import event_problem

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
    parser = JournalParser()
    events = list(stream_journal(job_dir, parser))
    bad, problems = parser.counts()
    return JournalRead(events, bad, problems)


def stream_journal(
    job_dir: Path, parser: JournalParser, *, offset: int = 0
) -> Iterator[dict[str, Any]]:
    """The journal's events from byte `offset` on (a line start), one at a time, so a journal
    of any length is read in the memory of one line; `parser` counts the bad ones and ends at
    the byte after the last whole line (`parser.offset`), where a later read goes on."""
    try:
        f = open(job_dir / EVENTS_FILE, "rb")
    except FileNotFoundError:
        return
    except OSError as e:  # not a directory, not readable
        raise UsageError(
            f"cannot read the journal of {job_dir}: {e.strerror or e}",
            hint="check the run directory (--run-dir) and its permissions",
        ) from None
    with f:
        if offset:
            f.seek(offset)
        parser.offset = offset
        yield from parser.lines(f)


class JournalParser:
    """Events from a journal's lines, the bad ones counted (read_journal). Kept between reads
    of a growing journal: a torn last line is left where it is (`offset` stays before it) until
    the writer ends it, and a torn line inside is damage unless a resumed controller closed it.
    Its state is plain data (`to_json`), so a summary can carry it (jobview/summary.py)."""

    def __init__(self) -> None:
        self.bad = 0
        self.problems: list[str] = []
        self.number = 0  # lines read
        self.offset = 0  # the byte after the last whole line read
        self.torn: str | None = None  # a bad line held back: closed by a resume, not damage
        self.raw = b""  # the last event's line as read (inspect --json copies it out)

    def counts(self) -> tuple[int, tuple[str, ...]]:
        """Bad lines so far, and the first reasons; a torn line held back counts (until a
        resumed controller closes it)."""
        if self.torn is None:
            return self.bad, tuple(self.problems)
        bad, problems = _count(self.bad, self.problems, self.torn)
        return bad, tuple(problems)

    @property
    def damage(self) -> str | None:
        bad, problems = self.counts()
        return JournalRead([], bad, problems).damage

    def to_json(self) -> dict[str, Any]:
        return {"bad": self.bad, "problems": self.problems, "number": self.number,
                "offset": self.offset, "torn": self.torn}  # fmt: skip

    @classmethod
    def from_json(cls, state: dict[str, Any]) -> JournalParser:
        parser = cls()
        parser.bad, parser.number, parser.offset = (
            int(state["bad"]),
            int(state["number"]),
            int(state["offset"]),
        )
        parser.problems = [str(p) for p in state["problems"]][:3]
        parser.torn = None if state["torn"] is None else str(state["torn"])
        return parser

    def lines(self, f: IO[bytes]) -> Iterator[dict[str, Any]]:
        while line := f.readline(MAX_EVENT_BYTES):
            if len(line) == MAX_EVENT_BYTES and not line.endswith(b"\n"):
                size = len(line)
                while (more := f.readline(MAX_EVENT_BYTES)) and not more.endswith(b"\n"):
                    size += len(more)  # the rest of an oversized line, dropped a piece at a time
                self.offset += size + len(more)
                self.number += 1
                self._bad(f"line {self.number}: longer than {MAX_EVENT_BYTES >> 20} MiB")
                continue
            ended = line.endswith(b"\n")
            event, problem = _event(line) if line.strip() else (None, None)
            if not ended and event is None:
                return  # a torn last line (a killed writer, or one being written): not damage
            self.offset += len(line)
            self.number += 1
            if event is not None:
                if self.torn is not None and event.get("kind") != "job_started":
                    self._bad(self.torn)
                self.torn = None  # a line a killed writer tore, closed by the controller resuming
                self.raw = line
                yield event
            elif problem in ("torn", "not UTF-8") and self.torn is None:
                self.torn = f"line {self.number}: {'not JSON' if problem == 'torn' else problem}"
            elif problem is not None:
                self._bad(f"line {self.number}: {'not JSON' if problem == 'torn' else problem}")

    def _bad(self, problem: str) -> None:
        self.bad, self.problems = _count(self.bad, self.problems, problem)


def _count(bad: int, problems: list[str], problem: str) -> tuple[int, list[str]]:
    return bad + 1, problems + [problem] if len(problems) < 3 else problems


def _event(line: bytes) -> tuple[dict[str, Any] | None, str | None]:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8"
    try:
        event = _DECODER.decode(text)
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


# One decoder for every line (json.loads with hooks would build one per line).
_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)


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
    term: int = 0  # the newest controller's term (its `run`; terms.py)
    # Where the last run's standby controller listens, (host, addr, port): a takeover of the
    # job, if there was one, runs there (docs/standby.md).
    standby: tuple[str, str, int] | None = None

    def next_term(self, *, takeover: bool) -> int:
        """The term of the controller that resumes the job (terms.py). A resume by hand of a
        job that had a standby skips one: the standby's takeover of the same run takes the next
        term, and two controllers of one term would both be obeyed (docs/standby.md)."""
        last = max(self.term, self.runs)
        return last + (2 if self.standby is not None and not takeover else 1)

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
    replacements = term = 0
    standby: tuple[str, str, int] | None = None
    for ev in events:
        kind = ev.get("kind")
        if isinstance(ev.get("t"), (int, float)):
            last_t = float(ev["t"])
        if isinstance(ev.get("step"), int) and kind in STEP_KINDS:
            last_step = max(last_step or 0, ev["step"])
        if kind == "job_started":
            runs += 1
            term = max(term, int(ev.get("run") or runs))
            standby = None  # a takeover runs without a standby of its own
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
        elif kind == "standby_ready":
            standby = (str(ev.get("host")), str(ev.get("addr")), int(ev.get("port") or 0))
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
        term,
        standby,
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
