"""The job's own failures, as opposed to the training script's: a controller task that raised
(`task_failed`), an agent task that raised (`agent_error`, which the agent sends before it
restarts the task or fences). Each is journaled and shown; one that cannot be restarted ends
the job with it as the root cause, instead of leaving a controller that silently stops watching.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ftrun.controller.reporting import JobOutcome, Reporter
from ftrun.errors import FtrunError
from ftrun.journal import Journal
from ftrun.tasks import TaskFailure, TaskSupervisor
from ftrun.wire.inbound import AgentError

T = TypeVar("T")


class InternalFailures:
    def __init__(
        self, journal: Journal, reporter: Reporter, *, generation: Callable[[], int]
    ) -> None:
        self.journal = journal
        self.reporter = reporter
        self.generation = generation
        self.tasks = TaskSupervisor(on_failure=self._task_failed, on_fatal=self._task_fatal)
        self.agent_errors: dict[str, str] = {}  # agent id → why it gave up (it fences next)
        self._fatal: asyncio.Future[TaskFailure] | None = None

    async def guard(self, main: Coroutine[Any, Any, T]) -> T | TaskFailure:
        """Run `main` (the supervise loop) unless one of our tasks fails for good first; a
        failure of `main` itself other than an FtrunError (a bug) comes back the same way. A
        callback that raises (a transport's reader) is journaled, not only printed."""
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(self._on_loop_exception)
        self._fatal = loop.create_future()
        task = asyncio.ensure_future(main)
        try:
            waits: list[asyncio.Future[Any]] = [task, self._fatal]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._fatal.done():
            return self._fatal.result()
        error = task.exception()
        if error is None:
            return task.result()
        if isinstance(error, FtrunError):
            raise error
        failure = self.tasks.report("supervise loop", error)
        self.reporter.notice(
            f"fatal: internal error: {failure.task} failed ({failure.error})", level="error"
        )
        return failure

    def outcome(self, failure: TaskFailure) -> JobOutcome:
        """The job's end when one of its own tasks failed for good: it is the root cause."""
        return JobOutcome.failed(
            f"internal error: {failure.task} failed ({failure.error})",
            {
                "kind": "internal",
                "task": failure.task,
                "exception": failure.error,
                "traceback": failure.traceback,
                "log": str(self.journal.job_dir / "events.jsonl"),
            },
        )

    def on_agent_error(self, sender: str, msg: AgentError) -> None:
        self.journal.record(
            "agent_error",
            agent=sender,
            gen=msg.gen,
            host=msg.host,
            task=msg.task,
            error=msg.error,
            traceback=msg.traceback,
            restarting=msg.restarting,
            fatal=msg.fatal,
        )
        then = "; restarting it" if msg.restarting else "; the agent stops" if msg.fatal else ""
        self.reporter.notice(
            f"agent on {msg.host}: {msg.task} failed: {msg.error}{then}", level="error"
        )
        if msg.fatal:
            self.agent_errors[sender] = f"its agent failed: {msg.task}: {msg.error}"

    def lost_reason(self, agent_id: str, reason: str) -> str:
        """Why a host was lost, with its agent's own failure when it reported one."""
        error = self.agent_errors.get(agent_id)
        return f"{reason}; {error}" if error else reason

    def _on_loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        if isinstance(error, asyncio.CancelledError):
            # Python 3.11's asyncio.streams asks a connection handler cancelled at shutdown for
            # its exception, which raises in a callback: cancellation is not a failure.
            return
        if error is None:
            loop.default_exception_handler(context)
        else:
            self.tasks.report(str(context.get("message") or "a callback"), error)

    def _task_failed(self, failure: TaskFailure) -> None:
        self.journal.record("task_failed", gen=self.generation(), **failure.fields())
        then = "; restarting it" if failure.restarting else ""
        self.reporter.notice(
            f"controller {failure.task} failed: {failure.error}{then}", level="error"
        )

    def _task_fatal(self, failure: TaskFailure) -> None:
        if self._fatal is not None and not self._fatal.done():
            self.reporter.notice(f"fatal: internal error: {failure.task} failed", level="error")
            self._fatal.set_result(failure)
