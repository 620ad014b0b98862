"""Slowing a process down as a throttled host is slow: stopped half the time, in 30 ms turns
(SIGSTOP/SIGCONT). Used by the straggler tests and scripts/bench_straggler.py."""

from __future__ import annotations

import os
import signal
import threading


def hold_back(pid: int, stop: threading.Event) -> None:
    """Until `stop` is set (or the process is gone): stopped 30 ms, running 30 ms; left running."""
    try:
        while not stop.is_set():
            os.kill(pid, signal.SIGSTOP)
            stop.wait(0.03)
            os.kill(pid, signal.SIGCONT)
            stop.wait(0.03)
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
