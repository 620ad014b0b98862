"""Where a job's controller runs (`controller_host` in job_started): a controller on another
machine (a standby's replica read on the standby host, a shared run directory) is not declared
dead because its pid is not this machine's; one on this machine still is (jobview/fold.py)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import psutil

from ftrun.jobview.fold import fold


def started(host: str | None, pid: int, create: float, run: int = 1) -> dict:
    ev = {"t": 1.0, "kind": "job_started", "name": "j", "controller_pid": pid, "run": run}
    ev["controller_create_time"] = create
    if host is not None:
        ev["controller_host"] = host
    return ev


def test_a_controller_on_another_machine_is_shown_there_not_called_dead(tmp_path: Path) -> None:
    view = fold(tmp_path / "job-a", [started("standby-host-x", 999_999, 1.0, run=2)])
    assert view.state == "running"
    assert "standby-host-x" in (view.reason or "") and "term 2" in (view.reason or "")
    assert view.to_json()["controller"] == {"host": "standby-host-x", "pid": 999_999, "term": 2}


def test_a_dead_controller_on_this_machine_is_still_called_dead(tmp_path: Path) -> None:
    for host in (socket.gethostname(), None):  # None: a journal of an older ftrun
        view = fold(tmp_path / "job-b", [started(host, 999_999, 1.0)])
        assert view.state == "failed", host
        assert "the controller died" in (view.reason or "")


def test_a_live_controller_on_this_machine_is_running(tmp_path: Path) -> None:
    me = psutil.Process(os.getpid())
    view = fold(tmp_path / "job-c", [started(socket.gethostname(), me.pid, me.create_time())])
    assert view.state == "running" and view.reason is None
