"""Telling a parked gloo worker from a busy one (ftrun/agent/gloo_quiesce.py), on real threads.

A thread of this process takes the gloo worker's name and blocks the way each case does: a
condition wait with no deadline (a parked worker), a wait with one (CPython's take_gil), a
sleep, a spin. (A real gloo group's workers: tests/integration/test_gloo_quiesce_real.py.)"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable

import pytest

from ftrun.agent import gloo_quiesce

pytestmark = pytest.mark.skipif(gloo_quiesce.FUTEX is None, reason="futex number unknown here")

PR_SET_NAME = 15


def named_worker(
    block: Callable[[threading.Event], None],
) -> tuple[threading.Thread, threading.Event]:
    stop = threading.Event()

    def body() -> None:
        ctypes.CDLL(None).prctl(PR_SET_NAME, gloo_quiesce.WORKER_NAME.encode(), 0, 0, 0)
        block(stop)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, stop


def settle(expect: bool, limit: float = 5.0) -> bool:
    """Whether busy_workers() comes to say `expect` (some busy) within `limit` seconds."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if bool(gloo_quiesce.busy_workers()) == expect:
            return True
        time.sleep(0.01)
    return False


def pass_on(lock: threading.Lock) -> None:
    lock.acquire()
    lock.release()


def spin(stop: threading.Event) -> None:
    while not stop.is_set():
        pass


def test_workers_waiting_together_without_a_deadline_are_parked():
    lock = threading.Lock()
    lock.acquire()
    workers = [named_worker(lambda stop: pass_on(lock)) for _ in range(2)]  # sem_wait
    try:
        assert settle(False)
        assert gloo_quiesce.wait_parked(limit=1.0)
    finally:
        lock.release()  # each waiter takes it and passes it on
    for thread, _ in workers:
        thread.join(5)
        assert not thread.is_alive()


def test_a_lone_wait_without_a_deadline_is_not_taken_for_parked():
    """CPython's drop_gil waits so for the GIL's next holder; it is not a parked worker."""
    lock = threading.Lock()
    lock.acquire()
    thread, _ = named_worker(lambda stop: pass_on(lock))
    try:
        assert settle(True)
        assert not gloo_quiesce.wait_parked(limit=0.2)
    finally:
        lock.release()
        thread.join(5)
    assert not thread.is_alive()


@pytest.mark.parametrize(
    "block",
    [
        pytest.param(lambda stop: stop.wait(30), id="a wait with a deadline, as for the GIL"),
        pytest.param(lambda stop: [time.sleep(0.05) for _ in iter(stop.is_set, True)], id="sleep"),
        pytest.param(spin, id="spinning"),
    ],
)
def test_a_worker_that_is_not_parked_is_waited_for_within_the_limit(block):
    thread, stop = named_worker(block)
    try:
        assert settle(True)
        t0 = time.monotonic()
        assert gloo_quiesce.wait_parked(limit=0.3) is False
        assert 0.3 <= time.monotonic() - t0 < 3
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive()


def test_syscall_lines_read_as_parked_only_for_a_condition_wait_without_deadline():
    nr = gloo_quiesce.FUTEX
    on = gloo_quiesce.parked_on
    assert on(f"{nr} 0x556cb5a18670 0x189 0x0 0x0 0x0 0x0 0x7ff 0x7f") == 0x556CB5A18670
    # the condition's other group of waiters, 4 bytes on (seen on real gloo workers)
    assert on(f"{nr} 0x556cb5a18674 0x189 0x0 0x0 0x0 0x0 0x7ff 0x7f") == 0x556CB5A18670
    assert on(f"{nr} 0x55 0x89 0x0 0x7ffd1234 0x0 0x0 0x7ff 0x7f") is None  # the GIL's take
    assert on(f"{nr} 0x55 0x80 0x2 0x0 0x0 0x0 0x7ff 0x7f") is None  # a mutex
    assert on("running") is None
    assert on("230 0x1 0x0 0x7ffd 0x0 0x0 0x0 0x7ff 0x7f") is None  # nanosleep
    assert on("") is None
