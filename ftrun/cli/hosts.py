"""`ftrun hosts JOB add|remove HOST`: change a running job's hosts; `ftrun hosts --quarantined
[--clear HOST|all]`: the hosts jobs quarantined (ftrun/quarantine.py), and letting them back.

`add` starts an agent on HOST: it fills a job that shrank (at the next safe point: once the
current generation steps) or waits as a ready spare; a quarantined host is refused, with the way
to clear it. `remove` takes HOST out: if it runs ranks, the job relaunches without it (a spare
takes its place when one is ready).
"""

from __future__ import annotations

import time
from pathlib import Path

import typer

from ftrun.cli import job_options
from ftrun.cli.control import ask
from ftrun.cli.render import make_console
from ftrun.config import resolve_run_dir
from ftrun.errors import UsageError
from ftrun.hostlist import split_target
from ftrun.journal.read import find_job_dir
from ftrun.quarantine import QuarantineStore

console = make_console(stderr=True)
ACTIONS = ("add", "remove")


def hosts(
    job: str | None = typer.Argument(None, help="A job id (or a unique prefix)."),
    action: str | None = typer.Argument(None, help="add or remove."),
    host: str | None = typer.Argument(
        None, help="The host, as for --hosts: host, user@host[:port]."
    ),
    run_dir: Path | None = job_options.RUN_DIR,
    quarantined: bool = typer.Option(
        False, "--quarantined", help="List the hosts jobs quarantined, with why and until when."
    ),
    clear: list[str] | None = typer.Option(
        None, "--clear", help="With --quarantined: let HOST back (repeatable; all: every one)."
    ),
) -> None:
    """Add a host to a running job (it grows back or waits as a spare), or remove one; or list
    and clear the hosts quarantined (--quarantined)."""
    if quarantined or clear:
        if job is not None or not quarantined:
            raise UsageError(
                "--quarantined lists the quarantine store, of no one job",
                hint="`ftrun hosts --quarantined [--clear HOST]`, or `ftrun hosts JOB add HOST`",
            )
        show_quarantined(clear or [])
        return
    if job is None or action is None or host is None:
        raise UsageError(
            "`ftrun hosts` needs JOB, add or remove, and HOST",
            hint="`ftrun hosts JOB add node5`, or `ftrun hosts --quarantined`",
        )
    if action not in ACTIONS:
        raise UsageError(f"unknown hosts action {action!r}", hint="one of: add, remove")
    split_target(host)  # a malformed host is refused here, with the usual message
    if action == "add":
        refuse_quarantined(host)
    job_dir = find_job_dir(resolve_run_dir(run_dir), job)
    ok, message = ask(job_dir, "hosts", "hosts_ack", action=action, host=host)
    if not ok:
        raise UsageError(
            f"hosts {action} refused: {message}",
            hint=f"`ftrun status {job_dir.name}` shows the job's hosts",
        )
    console.print(f"ftrun hosts: {message}")


def show_quarantined(clear: list[str]) -> None:
    store = QuarantineStore()
    if clear:
        gone = store.clear(clear)
        missing = [h for h in clear if h not in gone and h != "all"]
        for name in gone:
            console.print(f"ftrun hosts: {name} is no longer quarantined")
        if missing:
            raise UsageError(
                f"not quarantined: {', '.join(missing)}",
                hint="`ftrun hosts --quarantined` lists those that are",
            )
        return
    entries = store.active()
    if not entries:
        print(f"no host is quarantined ({store.path})")
        return
    for e in entries:
        until = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.until_t))
        print(f"{e.host}\tuntil {until}\t{e.reason} (job {e.job})")


def refuse_quarantined(host: str) -> None:
    known, _ = QuarantineStore().load()  # an unreadable store: the job decides
    entry = known.get(host)
    if entry is not None:
        until = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.until_t))
        raise UsageError(
            f"{host} is quarantined until {until}: {entry.reason} (job {entry.job})",
            hint=f"`ftrun hosts --quarantined --clear {host}` to use it again",
        )


def register(app: typer.Typer) -> None:
    app.command()(hosts)
