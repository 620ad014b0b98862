"""One generation as the controller sees it while it runs: which agents and hosts, how far it
got, and how its output becomes journal events (log lines, first step, progress, rank starts)."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from typing import Any

from ftrun.controller.evidence import Evidence, Failure
from ftrun.controller.reporting import Reporter
from ftrun.controller.stall import StallWatch
from ftrun.journal import Journal

PROGRESS_EVENT_INTERVAL_S = 5.0


@dataclass
class GenWatch:
    number: int
    agents: set[str]
    hosts: dict[str, str]
    done: set[str] = field(default_factory=set)
    max_step: int | None = None
    first_step_seen: bool = False
    last_progress_event: float = 0.0
    injected: dict[str, Any] | None = None
    order: list[str] = field(default_factory=list)  # agent ids by node rank
    stall: StallWatch | None = None  # exit barrier and idle guard


@dataclass
class Reconfigure:
    """A planned new generation (not a fault): grow onto ready hosts, or drop a removed one."""

    why: str  # grow | remove
    detail: str


def record_output(journal: Journal, reporter: Reporter, watch: GenWatch, host: str,
              msg: dict[str, Any]) -> bool:
    """Handle logs, progress and rank starts; True when the message was one of those."""
    kind = msg["kind"]
    if kind == "log":
        rank, lines = msg.get("rank"), msg.get("lines") or []
        if rank is None:
            journal.append_log(watch.number, f"{host}.torchrun", lines)
            reporter.torchrun_output(host, lines)
        else:
            journal.append_log(watch.number, f"rank{rank}", lines)
            reporter.rank_output(rank, lines)
        return True
    if kind == "progress":
        step = msg.get("step")
        if step is not None:
            watch.max_step = step if watch.max_step is None else max(watch.max_step, step)
        now = time.monotonic()
        if msg.get("first") and not watch.first_step_seen:
            watch.first_step_seen = True
            journal.record("first_step", gen=watch.number, host=host,
                                rank=msg.get("rank"), step=step, rank_t=msg.get("t"))
            watch.last_progress_event = now
        elif now - watch.last_progress_event >= PROGRESS_EVENT_INTERVAL_S:
            journal.record("progress", gen=watch.number, step=watch.max_step)
            watch.last_progress_event = now
        return True
    if kind == "signalled":
        journal.record("signal_delivered", gen=watch.number, host=host,
                       signal=msg.get("signal"), ranks=msg.get("ranks"))
        return True
    if kind == "rank_started":
        journal.record("rank_started", gen=watch.number, host=host,
                            rank=msg.get("rank"), pid=msg.get("pid"))
        return True
    return False


def root_cause(journal: Journal, ev: Evidence, number: int, result: Failure) -> dict[str, Any]:
    stream = f"rank{ev.rank}" if ev.rank is not None else f"{ev.host}.torchrun"
    return {"kind": ev.kind, "host": ev.host, "rank": ev.rank, "exit_code": ev.exit_code,
            "signal": ev.signal, "exception": ev.exception, "generation": number,
            "traceback": result.detail.get("traceback"),
            "traceback_source": result.detail.get("traceback_source"),
            "tail": (result.detail.get("tail") or [])[-15:],
            "log": str(journal.log_path(number, stream))}


def free_port() -> int:
    """A port for the next generation's rendezvous, picked before it is needed so a restart
    never waits on a port still in TIME_WAIT from the generation it replaces."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
