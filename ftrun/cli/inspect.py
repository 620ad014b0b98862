"""`ftrun inspect JOB`: the timeline of a job, its generations and incidents with their phases.

With --html FILE and --png FILE it also draws that timeline (ftrun.jobview.timeline for the data,
timeline_html.py and timeline_png.py for the pictures); both are made before anything is printed
or written, so a missing matplotlib or an unwritable path fails the command cleanly.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import typer
from rich.text import Text

from ftrun.cli import job_options
from ftrun.cli.goodput_render import goodput_table, ratio_text
from ftrun.cli.render import clock, make_console, print_job, secs
from ftrun.cli.safetext import clean, plain
from ftrun.config import resolve_run_dir
from ftrun.errors import UsageError
from ftrun.jobview import Generation, Incident, JobView, load_job
from ftrun.jobview.goodput import GoodputReport, job_goodput
from ftrun.jobview.timeline import build_timeline
from ftrun.journal.read import JournalParser, find_job_dir, stream_journal
from ftrun.outputs import write_output

console = make_console()
err_console = make_console(stderr=True)
STACK_LINES = 12


def inspect(
    job: str = typer.Argument(..., help="A job id (or a unique prefix)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    run_dir: Path | None = job_options.RUN_DIR,
    html_file: Path | None = typer.Option(
        None,
        "--html",
        metavar="FILE",
        help="Also draw the timeline into FILE: one self-contained web page (loads nothing).",
    ),
    png_file: Path | None = typer.Option(
        None,
        "--png",
        metavar="FILE",
        help="Also draw the timeline into FILE as a PNG image (needs matplotlib: "
        "pip install 'ftrun[plot]').",
    ),
) -> None:
    """Show what happened: generations, incidents and their phases, the root cause, the logs."""
    job_dir = find_job_dir(resolve_run_dir(run_dir), job)
    view = load_job(job_dir)
    now = time.time()
    report = job_goodput(view, now=now)
    written = draw_timeline(view, report, now=now, html_file=html_file, png_file=png_file)
    if as_json:
        out = view.to_json(detail=True)
        out["goodput"] = report.to_json()
        print_json_with_events(out, job_dir)
    else:
        print_inspect(view, report)
    for what, path in written:  # on stderr with --json: stdout stays one JSON document
        (err_console if as_json else console).print(f"{what} written to {path}", soft_wrap=True)


def print_json_with_events(out: dict[str, Any], job_dir: Path) -> None:
    """`out` with the journal's events last, copied a line at a time as the journal is read
    again (each one checked as `status` checks it), so a journal of any length is printed in
    the memory of one line. An event's line is JSON already: it is printed as it is."""
    head = json.dumps(out, indent=2, default=str)
    sys.stdout.flush()
    stdout = sys.stdout.buffer
    stdout.write(head[: head.rindex("}")].rstrip().encode() + b',\n  "events": [')
    parser = JournalParser()
    sep = b"\n    "
    for _ in stream_journal(job_dir, parser):
        stdout.write(sep + parser.raw.rstrip(b"\r\n"))
        sep = b",\n    "
    stdout.write(b"\n  ]\n}\n")
    stdout.flush()


def draw_timeline(
    view: JobView,
    report: GoodputReport | None = None,
    *,
    now: float | None = None,
    html_file: Path | None,
    png_file: Path | None,
) -> list[tuple[str, Path]]:
    """Draw the pictures asked for, then write them; (what, absolute path) of each."""
    if html_file is None and png_file is None:
        return []
    if html_file is not None and png_file is not None and html_file.resolve() == png_file.resolve():
        raise UsageError(
            f"--html and --png both name {html_file}", hint="give each picture its own file"
        )
    timeline = build_timeline(view, now=time.time() if now is None else now, report=report)
    pictures: list[tuple[str, str, Path, bytes]] = []
    if html_file is not None:
        from ftrun.cli.timeline_html import render_html

        pictures.append(("--html", "timeline page", html_file, render_html(timeline).encode()))
    if png_file is not None:
        from ftrun.cli.timeline_png import render_png

        pictures.append(("--png", "timeline image", png_file, render_png(timeline)))
    return [(what, _write(flag, path, data)) for flag, what, path, data in pictures]


def _write(flag: str, path: Path, data: bytes) -> Path:
    try:
        write_output(path, data, flag=flag)  # temp + rename: never through a planted link
    except OSError as e:
        if isinstance(e, IsADirectoryError):
            hint = f"{flag} takes a file name, e.g. {flag} {path / ('timeline.' + flag[2:])}"
        elif isinstance(e, FileNotFoundError | NotADirectoryError):
            hint = f"create {path.parent} first, or write into an existing directory"
        else:
            hint = f"pick a file in a directory you can write, e.g. {flag} ./{path.name}"
        raise UsageError(f"cannot write {flag} {path}: {e.strerror or e}", hint=hint) from e
    return path.resolve()


def print_inspect(view: JobView, report: GoodputReport) -> None:
    print_job(console, view)
    console.print()
    console.print(Text("timeline", style="bold"))
    print_timeline(view)
    if report.job.wall_s > 0:
        console.print()
        if report.job.unknown is not None:  # no progress signal: "—" and why, not 0 %
            line = Text.assemble(
                ("goodput ", "bold"), ("—", "bold"), clean(f": {report.job.unknown}")
            )
        else:
            line = Text.assemble(
                ("goodput ", "bold"),
                (ratio_text(report.job), "bold green"),
                " of the wall time was training that was kept"
                + (" (so far)" if view.state == "running" else ""),
            )
        console.print(line, soft_wrap=True)
        console.print(goodput_table(report))
    print_stragglers(view)
    logs = view.job_dir / "logs"
    if logs.is_dir():
        console.print()
        console.print(plain(f"logs: {logs}/g<generation>/rank<rank>.log", "dim"))


def print_stragglers(view: JobView) -> None:
    """Each straggler named (controller/pace.py), and each host's latest compute per step."""
    pace = view.pace
    if not pace.stragglers and not pace.latest:
        return
    console.print()
    console.print(Text(f"pace (compute seconds a step, by {pace.unit})", style="bold"))
    if pace.latest:
        shown = ", ".join(f"{u} {v:.3g}" for u, v in sorted(pace.latest.items()))
        console.print(clean(f"  latest: {shown}"), soft_wrap=True)
    for s in pace.stragglers:
        back = " (back at the others' pace since)" if s.get("recovered_t") else ""
        console.print(
            clean(
                f"  straggler: {s.get('unit')} in generation {s.get('gen')} from step "
                f"{s.get('step')}: {_num(s.get('compute_s'), '.3g')} s against "
                f"{_num(s.get('median_s'), '.3g')} s on the others ({s.get('ratio')}x){back}"
            ),
            style="yellow",
            soft_wrap=True,
        )


def print_timeline(view: JobView) -> None:
    incidents = {i.generation: i for i in view.incidents}
    for g in view.generations:
        first = (
            f", first step after {secs(g.first_step_t - g.launched_t)}" if g.first_step_t else ""
        )
        console.print(
            f"  {clock(g.launched_t)}  generation {g.number} launched on "
            f"{', '.join(g.hosts)} ({g.world_size} ranks){first}; "
            f"{g.outcome or 'running'}"
            + (f" at step {g.last_step}" if g.last_step is not None else "")
        )
        if g.plan is not None:
            console.print(f"    plan {_plan(g)}", soft_wrap=True)
        inc = incidents.get(g.number)
        if inc is None:
            continue
        console.print(
            Text.assemble(
                "    ",
                (clean(f"incident {inc.id}: {inc.kind}"), "bold yellow"),
                clean(
                    f" — {_evidence(inc)} → {inc.tier or '?'}"
                    + (f" (injected: {inc.injected})" if inc.injected else "")
                ),
            ),
            soft_wrap=True,
        )
        if inc.reason:
            console.print(f"      decision: {inc.reason}", soft_wrap=True)
        base = inc.fault_t if inc.fault_t is not None else inc.detected_t
        for name, t in inc.phases():
            rel = "" if t is None else f"  (+{t - base:.3f}s)"
            console.print(f"      {name:<17} {clock(t)}{rel}")
        if inc.restored_tier is not None or inc.lost_steps is not None:
            console.print(f"      {_recovery(inc)}", soft_wrap=True)
        if inc.traceback:
            if inc.traceback_source == "error file":
                console.print(
                    Text("      traceback from the rank's error file (@record):", style="dim")
                )
            console.print(plain("      " + str(inc.traceback).replace("\n", "\n      "), "red"))
        for rank, text in sorted((inc.stacks or {}).items()):
            lines = text.splitlines()
            shown = "\n        ".join(lines[:STACK_LINES])
            more = (
                f"\n        ... {len(lines) - STACK_LINES} more lines (--json)"
                if len(lines) > STACK_LINES
                else ""
            )
            console.print(
                plain(
                    f"      stacks of rank {rank} ({(inc.states or {}).get(rank, '?')}):\n"
                    f"        {shown}{more}",
                    "dim",
                )
            )
    if view.ended_t:
        console.print(f"  {clock(view.ended_t)}  job {view.state}: {view.reason}", soft_wrap=True)


def _plan(g: Generation) -> str:
    """`DP2xPP2 1F1B m4xM6 (why): predicted 0.41 s/step, measured 0.45 s/step (+10%)`."""
    text = f"{g.plan} ({g.plan_why})"
    if g.predicted_step_s is not None:
        text += f": predicted {g.predicted_step_s:.3g} s/step"
    measured = g.measured_step_s
    if measured is not None:
        text += f", measured {measured:.3g} s/step"
        if g.predicted_step_s:
            text += f" ({(measured / g.predicted_step_s - 1) * 100:+.0f}%)"
    return text


def _recovery(inc: Incident) -> str:
    """What the relaunch restored (ftrun.checkpoint reports it) and what the fault cost."""
    if inc.restored_tier == "none":
        restored = "restored: nothing (no checkpoint yet), restarted from step 0"
    elif inc.restored_tier is not None:
        restored = f"restored: step {inc.restored_step} from {inc.restored_tier}"
    else:
        restored = f"resumed at step {inc.step_resumed}"
    if inc.restore_rejected is not None:
        restored = (
            f"restore of step {inc.restore_rejected} rejected (the same failure twice right "
            f"after it): {restored}"
        )
    if inc.restore_skipped:
        restored += f" (skipped: {'; '.join(inc.restore_skipped)})"
    if inc.lost_steps is None:
        return restored
    what = "stopped" if inc.kind == "preempted" else "failed"
    return f"{restored}; steps lost: {inc.lost_steps} ({what} at step {inc.step_at_fault})"


def _evidence(inc: Incident) -> str:
    who = f"rank {inc.rank}" if inc.rank is not None else "torchrun"
    if inc.kind == "host-lost":
        return f"host {inc.host}: heartbeat or connection lost"
    if inc.kind == "preempted":
        return f"preemption notice ({inc.signal}) at step {inc.step_at_fault}"
    if inc.kind == "controller-lost":
        return "the controller died (its last journal entry → `ftrun resume`)"
    if inc.kind == "exit_hang":
        return (
            f"rank {inc.clean_rank} exited 0; {who} on {inc.host} was still running "
            f"{_num(inc.allowance_s, 'g')}s later (--exit-timeout)" + _missing(inc)
        )
    if inc.kind == "hang" and inc.idle_s is not None:
        return (
            f"idle: no CPU and no output for {_num(inc.idle_s, '.0f')} s on any rank "
            f"(--idle-timeout; no progress signal)" + _missing(inc)
        )
    if inc.kind == "hang":
        where = f" in section {inc.section!r}" if inc.section else ""
        past = (
            f", detected {inc.past_allowance_s:.2f}s past its {inc.allowance_s:.1f}s allowance"
            if inc.past_allowance_s is not None and inc.allowance_s is not None
            else ""
        )
        return f"{who} on {inc.host} made no progress{where}{past}"
    how = f"signal {inc.signal}" if inc.signal else f"exit code {inc.exit_code}"
    return f"{who} on {inc.host}, {how}" + (f": {inc.exception}" if inc.exception else "")


def _num(value: float | None, spec: str) -> str:
    return "?" if value is None else format(value, spec)


def _missing(inc: Incident) -> str:
    if not inc.stacks_missing_from:
        return ""
    return f"; no stacks from {', '.join(inc.stacks_missing_from)} in time"


def register(app: typer.Typer) -> None:
    app.command()(inspect)
