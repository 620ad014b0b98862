"""`ftrun status --watch`: the jobs' state, refreshed in place until Ctrl-C.

Per job: its state, generation, plan, hosts, step and step rate, its last incident and its
goodput so far (— and why, without a progress signal), all read from the journal as `status`
and `inspect` read it. On a terminal the table is redrawn in place (rich Live): it is laid out
at the terminal's width on every refresh, so a resize takes effect at the next one; below 100
columns each job is a block of short lines instead, as a table that narrow would squeeze
columns out. Piped, a snapshot is printed every interval, one after another, without cursor
movement (as `kubectl get -w` streams): a file or `grep` gets text it can read. Ctrl-C leaves
the watch: exit 0, it is how a watch ends.

A running job's journal grows by a line a second; each refresh re-reads the jobs whose journal
changed (size or mtime) and reuses the rest.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ftrun.cli.goodput_render import ratio_text
from ftrun.cli.render import age, state_text
from ftrun.cli.safetext import clean, plain
from ftrun.jobview import JobView, load_job
from ftrun.jobview.goodput import job_goodput
from ftrun.jobview.series import RATE_WINDOW_S
from ftrun.journal.read import find_job_dir, list_job_dirs


@dataclass
class _Cached:
    stamp: tuple[int, int]
    view: JobView


class JobCache:
    """Job views, re-read only when their journal changed (and while they run: their goodput
    and age move with the clock)."""

    def __init__(self) -> None:
        self._views: dict[Path, _Cached] = {}

    def view(self, job_dir: Path) -> JobView:
        try:
            st = os.stat(job_dir / "events.jsonl")
            stamp = (st.st_size, st.st_mtime_ns)
        except OSError:
            stamp = (-1, -1)
        cached = self._views.get(job_dir)
        if cached is None or cached.stamp != stamp or cached.view.state == "running":
            cached = _Cached(stamp, load_job(job_dir))
            self._views[job_dir] = cached
        return cached.view


def step_rate(view: JobView, now: float) -> float | None:
    """Steps a second over the last RATE_WINDOW_S of the current generation's progress (the
    fold keeps those seconds' points: jobview/series.py)."""
    series = view.series
    points = list(series.recent) if series.recent_gen == view.generation else []
    if len(points) < 2 or view.state != "running":
        return None
    recent = [p for p in points if p[0] >= points[-1][0] - RATE_WINDOW_S] or points[-2:]
    if len(recent) < 2:
        recent = points[-2:]
    (t0, s0), (t1, s1) = recent[0], recent[-1]
    return (s1 - s0) / (t1 - t0) if t1 > t0 else None


def hosts_text(view: JobView) -> str:
    counts: dict[str, int] = {}
    for state in view.hosts.values():
        counts[state] = counts.get(state, 0) + 1
    order = ("active", "spare", "starting", "lost", "unreachable", "removed")
    text = " ".join(f"{counts[s]} {s}" for s in order if counts.get(s)) or "-"
    slow = [s for s in view.pace.stragglers
            if s.get("recovered_t") is None and s.get("gen") == view.generation]  # fmt: skip
    if slow:  # named stragglers of the running generation (docs/policy.md, Stragglers)
        text += "; slow: " + ", ".join(f"{s.get('unit')} {s.get('ratio')}x" for s in slow)
    return text


def last_incident(view: JobView, now: float) -> str:
    if not view.incidents:
        return "-"
    inc = view.incidents[-1]
    return f"#{inc.id} {inc.kind} → {inc.tier or '?'}, {age(now - inc.detected_t)} ago"


def jobs_watch_table(views: list[JobView], now: float) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col, kw in (
        ("JOB", {"overflow": "fold", "min_width": 12}),
        ("STATE", {}),
        ("GEN", {"justify": "right"}),
        ("PLAN", {"overflow": "fold"}),
        ("HOSTS", {"overflow": "fold"}),
        ("STEP", {"justify": "right"}),
        ("STEPS/S", {"justify": "right"}),
        ("LAST INCIDENT", {"overflow": "fold"}),
        ("GOODPUT", {"justify": "right"}),
    ):
        table.add_column(col, **kw)
    unknown: dict[str, None] = {}  # why goodput is — (no progress signal), once each
    for v in views:
        plan = v.generations[-1].plan if v.generations else None
        rate = step_rate(v, now)
        goodput = job_goodput(v, now=now).job
        if goodput.unknown is not None:
            unknown[goodput.unknown] = None
        table.add_row(
            plain(v.job_id),
            state_text(v.state),
            str(v.generation),
            plain(plan or "-"),
            plain(hosts_text(v)),
            "-" if v.step is None else str(v.step),
            "-" if rate is None else f"{rate:.3g}",
            plain(last_incident(v, now)),
            ratio_text(goodput),
        )
    if unknown:
        table.caption = Text("goodput —: " + "; ".join(unknown), style="dim")
        table.caption_justify = "left"
    return table


NARROW = 100  # below this many columns the table would squeeze columns out: one block a job


def jobs_watch_blocks(views: list[JobView], now: float) -> Group:
    """The same figures, one job to a few short lines: for a narrow terminal."""
    parts: list[Text] = []
    for v in views:
        plan = v.generations[-1].plan if v.generations else None
        rate = step_rate(v, now)
        goodput = job_goodput(v, now=now).job
        parts.append(
            Text.assemble(
                (clean(v.job_id), "bold"),
                "  ",
                state_text(v.state),
                f"  gen {v.generation}  step {'-' if v.step is None else v.step}",
                f"  {'-' if rate is None else format(rate, '.3g')} steps/s",
                f"  goodput {ratio_text(goodput)}",
            )  # fmt: skip
        )
        if goodput.unknown is not None:
            parts.append(Text(f"  goodput —: {goodput.unknown}", style="dim"))
        parts.append(Text(clean(f"  hosts: {hosts_text(v)}" + (f"; plan {plan}" if plan else ""))))
        parts.append(Text(clean(f"  last incident: {last_incident(v, now)}"), style="dim"))
    return Group(*parts)


def snapshot(directory: Path, job: str | None, cache: JobCache, width: int = NARROW) -> Group:
    now = time.time()
    if job is not None:
        dirs = [find_job_dir(directory, job)]
    else:
        dirs = list_job_dirs(directory)
    views = sorted((cache.view(d) for d in dirs), key=lambda v: v.started_t or 0.0, reverse=True)
    stamp = Text(
        time.strftime("%H:%M:%S", time.localtime(now)) + f"  {directory}  (Ctrl-C to stop)",
        style="dim",
    )
    if not views:
        return Group(stamp, Text(f"no jobs in {directory} yet"))
    if width < NARROW:
        return Group(stamp, jobs_watch_blocks(views, now))
    return Group(stamp, jobs_watch_table(views, now))


def watch(console: Console, directory: Path, job: str | None, interval_s: float) -> None:
    """Until Ctrl-C (which returns normally: leaving a watch is no error).

    Ctrl-C sets a flag rather than raising KeyboardInterrupt: raised in the middle of a refresh,
    the exception could land in a finalizer the garbage collector runs (a fold makes garbage),
    where Python prints and drops it, and the watch went on for ever (seen on a loaded machine).
    A second Ctrl-C raises, for a refresh that does not end."""
    stop = threading.Event()

    def on_interrupt(signum: int, frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    cache = JobCache()
    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        if not console.is_terminal:
            while not stop.is_set():
                console.print(snapshot(directory, job, cache, console.width))
                console.print()
                stop.wait(interval_s)
            return
        with Live(console=console, auto_refresh=False, transient=False) as live:
            while not stop.is_set():
                live.update(snapshot(directory, job, cache, console.width), refresh=True)
                stop.wait(interval_s)
    except KeyboardInterrupt:
        return
    finally:
        signal.signal(signal.SIGINT, previous)
