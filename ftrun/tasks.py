"""Background tasks that cannot stop silently.

asyncio keeps a task's exception to itself until someone awaits the task, and the loop holds only
a weak reference to a fire-and-forget task. A tail loop that raised once would simply be gone:
no more log forwarding, no more hang detection, and nothing said. So every task the controller
and the agent start goes through a TaskSupervisor, which

- keeps a strong reference to it (until it ends), and can cancel them all at the end;
- on an unexpected exception logs the traceback and calls the owner's `on_failure` (the agent
  tells the controller, which journals `agent_error`; the controller journals `task_failed`);
- then restarts it, for a loop started with `restart=True`, after RESTART_DELAY_S, at most
  MAX_RESTARTS times within RESTART_WINDOW_S (a loop that keeps failing is not papered over);
- or else calls the owner's `on_fatal`: the agent fences (kills its ranks, exits: the controller
  sees a lost host, with the reason already in its journal); the controller ends the job with
  the failure as its root cause.

Pure asyncio and logging: the agent and the controller both import it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("ftrun.tasks")

MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
RESTART_DELAY_S = 0.05
TRACEBACK_CHARS = 8000


@dataclass(frozen=True)
class TaskFailure:
    task: str
    error: str  # "ValueError: what went wrong"
    traceback: str
    restarting: bool  # it runs again
    fatal: bool = False  # its owner gives up (the agent fences, the controller ends the job)

    def fields(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "error": self.error,
            "traceback": self.traceback,
            "restarting": self.restarting,
            "fatal": self.fatal,
        }


def _ignore(failure: TaskFailure) -> None:
    pass


class TaskSupervisor:
    def __init__(
        self,
        *,
        on_failure: Callable[[TaskFailure], None] = _ignore,
        on_fatal: Callable[[TaskFailure], None] = _ignore,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.on_failure = on_failure
        self.on_fatal = on_fatal
        self.clock = clock
        self.tasks: set[asyncio.Task[Any]] = set()
        self.closing = False
        self._recent: dict[str, deque[float]] = {}

    def spawn(
        self,
        name: str,
        work: Coroutine[Any, Any, Any] | Callable[[], Awaitable[Any]],
        *,
        restart: bool = False,
    ) -> asyncio.Task[Any]:
        """Start `work` (a coroutine, or for restart=True a function that makes one)."""
        assert not (restart and asyncio.iscoroutine(work)), "a restartable task needs a factory"
        coro = work if asyncio.iscoroutine(work) else work()
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(lambda t: self._done(name, work, restart, t))
        return task

    def report(
        self, name: str, error: BaseException, *, restarting: bool = False, fatal: bool = False
    ) -> TaskFailure:
        """Log and report an exception; called directly for one caught elsewhere (a callback,
        a per-message handler) that the caller handles itself."""
        text = "".join(traceback.format_exception(error))
        log.error("%s failed:\n%s", name, text)
        failure = TaskFailure(
            name, f"{error.__class__.__name__}: {error}", text[-TRACEBACK_CHARS:], restarting, fatal
        )
        try:
            self.on_failure(failure)
        except Exception:  # the report must not take down what reports
            log.exception("could not report the failure of %s", name)
        return failure

    def cancel_all(self) -> None:
        self.closing = True
        for task in list(self.tasks):
            task.cancel()

    async def wait_all(self, timeout_s: float) -> None:
        """Let the tasks still running finish, up to a deadline; then cancel the rest."""
        pending = {t for t in self.tasks if not t.done()}
        if pending:
            _, late = await asyncio.wait(pending, timeout=timeout_s)
            for task in late:
                task.cancel()

    def _done(self, name: str, work: Any, restart: bool, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            return
        restarting = restart and not self.closing and self._may_restart(name)
        failure = self.report(
            name, error, restarting=restarting, fatal=not restarting and not self.closing
        )
        if restarting:
            asyncio.get_running_loop().call_later(RESTART_DELAY_S, self._respawn, name, work)
        elif not self.closing:
            try:
                self.on_fatal(failure)
            except Exception:
                log.exception("could not act on the failure of %s", name)

    def _may_restart(self, name: str) -> bool:
        now = self.clock()
        recent = self._recent.setdefault(name, deque())
        while recent and now - recent[0] > RESTART_WINDOW_S:
            recent.popleft()
        if len(recent) >= MAX_RESTARTS:
            return False
        recent.append(now)
        return True

    def _respawn(self, name: str, work: Callable[[], Awaitable[Any]]) -> None:
        if not self.closing:
            log.warning("restarting %s", name)
            self.spawn(name, work, restart=True)
