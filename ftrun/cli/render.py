"""Rendering for people: live console output of a job, and the status/inspect tables."""

from __future__ import annotations

import datetime as dt
import sys
import time
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ftrun.cli.safetext import clean, make_console, plain
from ftrun.jobview import Incident, JobView

__all__ = ["ConsoleReporter", "make_console", "print_job", "print_root_cause"]


STATE_STYLE = {"running": "cyan", "succeeded": "green", "failed": "bold red", "stopped": "yellow"}


class ConsoleReporter:
    """Streams rank output to stdout with torchrun's `[rankN]:` prefix; notices go to stderr."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def rank_output(self, rank: int, lines: list[str]) -> None:
        sys.stdout.write("".join(f"[rank{rank}]: {line}\n" for line in lines))
        sys.stdout.flush()

    def torchrun_output(self, host: str, lines: list[str]) -> None:
        pass  # torchrun's own chatter goes to its log; what matters reaches the root cause

    def notice(self, text: str, *, level: str = "info") -> None:
        style = {"info": "bold cyan", "warning": "bold yellow", "error": "bold red"}[level]
        self.console.print(Text.assemble(("ftrun: ", style), clean(text)), soft_wrap=True)


def age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}s"


def clock(t: float | None) -> str:
    return "-" if t is None else dt.datetime.fromtimestamp(t).strftime("%H:%M:%S.%f")[:-3]


def state_text(state: str) -> Text:
    return plain(state, STATE_STYLE.get(state, ""))


def jobs_table(views: list[JobView]) -> Table:
    table = Table(box=None, header_style="bold")
    for col in ("JOB", "NAME", "STATE", "GEN", "RESTARTS", "STEP", "AGE"):
        table.add_column(col)
    now = time.time()
    for v in views:
        table.add_row(
            plain(v.job_id),
            plain(v.name),
            state_text(v.state) + Text(" (damaged)", "red") if v.damaged else state_text(v.state),
            str(v.generation),
            str(v.restarts),
            "-" if v.step is None else str(v.step),
            age(v.age_s(now)),
        )
    return table


def incidents_table(incidents: list[Incident]) -> Table:
    table = Table(box=None, header_style="bold")
    for col in (
        "#",
        "GEN",
        "KIND",
        "TIER",
        "HOST",
        "RANK",
        "EVIDENCE",
        "DETECTED",
        "RECOVERED",
        "LOST STEPS",
    ):
        table.add_column(col)
    for i in incidents:
        evidence = (
            f"signal {i.signal}"
            if i.signal
            else (f"exit {i.exit_code}" if i.exit_code is not None else (i.reason or ""))
        )
        table.add_row(
            str(i.id),
            str(i.generation),
            plain(i.kind),
            plain(i.tier or "-"),
            plain(i.host or "-"),
            plain("-" if i.rank is None else i.rank),
            plain(evidence),
            secs(i.detected_s),
            secs(i.recovered_s),
            "-" if i.lost_steps is None else str(i.lost_steps),
        )
    return table


def print_job(console: Console, v: JobView) -> None:
    console.print(
        Text.assemble(
            ("job ", "bold"),
            (clean(v.job_id), "bold"),
            "  ",
            state_text(v.state),
            clean(
                f"  name={v.name}  generation={v.generation}  "
                f"restarts={v.restarts}  step={'-' if v.step is None else v.step}"
            ),
        )
    )
    if v.damaged:
        console.print(Text.assemble(("damaged: ", "bold red"), clean(v.damaged)), soft_wrap=True)
    if v.reason:
        console.print(f"reason: {v.reason}", soft_wrap=True)
    if v.controller_host is not None and v.ended_t is None:
        console.print(
            clean(f"controller: {v.controller_host} pid {v.controller_pid}, term {v.runs}")
        )
    current = v.generations[-1] if v.generations else None
    if current is not None and current.plan is not None:
        console.print(f"plan: {current.plan} on {len(current.hosts)} host(s)", soft_wrap=True)
    console.print(
        f"started {clock(v.started_t)}, "
        + (f"ended {clock(v.ended_t)}" if v.ended_t else f"running for {age(v.age_s())}")
        + f"; directory {v.job_dir}",
        soft_wrap=True,
    )
    if len(v.hosts) > 1 or any(h != "localhost" for h in v.hosts):
        order = {"active": 0, "spare": 1, "starting": 2, "unreachable": 3, "lost": 4, "removed": 5}
        shown = sorted(v.hosts.items(), key=lambda item: order.get(item[1], 9))
        console.print("hosts: " + ", ".join(f"{h} ({state})" for h, state in shown), soft_wrap=True)
    if v.turned_away:
        told = ", ".join(f"{n} {label}" for label, n in v.turned_away.items())
        console.print(
            Text.assemble(("turned away: ", "yellow"), told, " (docs/security.md)"),
            soft_wrap=True,
        )
    if v.incidents:
        console.print()
        console.print(incidents_table(v.incidents))
    print_root_cause(console, v.root_cause)


def print_root_cause(console: Console, root: dict[str, Any] | None) -> None:
    if not root or root.get("kind") is None:
        return
    if root["kind"] == "internal":  # ftrun's own bug: its traceback is in the journal
        console.print()
        console.print(
            Text.assemble(
                ("root cause: ", "bold red"),
                clean(f"ftrun's {root.get('task')} failed: {root.get('exception')}"),
            ),
            soft_wrap=True,
        )
        console.print(f"traceback: in the job's journal, {root.get('log')}", soft_wrap=True)
        return
    who = f"rank {root['rank']}" if root.get("rank") is not None else "torchrun"
    how = f"signal {root['signal']}" if root.get("signal") else f"exit code {root.get('exit_code')}"
    console.print()
    console.print(
        Text.assemble(
            ("root cause: ", "bold red"),
            clean(
                f"{who} on {root.get('host')} (generation {root.get('generation')}) "
                f"died with {how}" + (f": {root['exception']}" if root.get("exception") else "")
            ),
        ),
        soft_wrap=True,
    )
    if root.get("traceback"):
        if root.get("traceback_source") == "error file":
            console.print(
                Text("traceback (from the rank's error file, torch's @record):", style="dim")
            )
        console.print(plain(root["traceback"], "red"), soft_wrap=True)
    elif root.get("tail"):
        tail = root["tail"] if isinstance(root["tail"], list) else [root["tail"]]
        console.print(plain("\n".join(map(str, tail)), "dim"), soft_wrap=True)
    if root.get("log"):
        console.print(f"log: {root['log']}", soft_wrap=True)
