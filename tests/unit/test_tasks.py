"""TaskSupervisor: a failing task is reported with its traceback, then restarted or escalated."""

from __future__ import annotations

import asyncio

from ftrun import tasks as tasks_mod
from ftrun.tasks import TaskFailure, TaskSupervisor


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_a_failing_loop_is_reported_and_restarted_until_the_limit(caplog):
    failures: list[TaskFailure] = []
    fatal: list[TaskFailure] = []
    starts = []

    async def scenario():
        done = asyncio.Event()
        sup = TaskSupervisor(
            on_failure=failures.append, on_fatal=lambda f: (fatal.append(f), done.set())
        )

        async def loop():
            starts.append(1)
            await asyncio.sleep(0)
            raise ValueError(f"boom {len(starts)}")

        sup.spawn("tail loop", loop, restart=True)
        await done.wait()
        assert not sup.tasks

    run(scenario())
    assert len(starts) == tasks_mod.MAX_RESTARTS + 1
    assert [f.restarting for f in failures] == [True] * tasks_mod.MAX_RESTARTS + [False]
    assert [f.fatal for f in failures] == [False] * tasks_mod.MAX_RESTARTS + [True]
    assert failures[0].task == "tail loop" and failures[0].error == "ValueError: boom 1"
    assert "Traceback" in failures[0].traceback and "in loop" in failures[0].traceback
    assert fatal == [failures[-1]]
    assert "tail loop failed" in caplog.text and "ValueError: boom 1" in caplog.text


def test_a_loop_that_recovers_keeps_running():
    failures: list[TaskFailure] = []

    async def scenario():
        sup = TaskSupervisor(on_failure=failures.append)
        ticks = []

        async def loop():
            ticks.append(1)
            if len(ticks) == 1:
                raise RuntimeError("once")
            while True:
                ticks.append(1)
                await asyncio.sleep(0.001)

        sup.spawn("heartbeat loop", loop, restart=True)
        while len(ticks) < 20:
            await asyncio.sleep(0.01)
        assert len(sup.tasks) == 1  # a strong reference to the running one
        sup.cancel_all()
        await asyncio.sleep(0)
        return ticks

    assert len(run(scenario())) >= 20
    assert [(f.task, f.restarting, f.fatal) for f in failures] == [("heartbeat loop", True, False)]


def test_a_one_shot_task_that_fails_is_fatal_and_cancellation_is_not_a_failure():
    failures: list[TaskFailure] = []
    fatal: list[TaskFailure] = []

    async def scenario():
        sup = TaskSupervisor(on_failure=failures.append, on_fatal=fatal.append)

        async def stop():
            raise KeyError("gen")

        async def forever():
            await asyncio.Event().wait()

        sup.spawn("stop", stop())
        waiting = sup.spawn("wait", forever())
        await asyncio.sleep(0.01)
        sup.cancel_all()
        await asyncio.gather(waiting, return_exceptions=True)

    run(scenario())
    assert [f.task for f in failures] == ["stop"] and [f.task for f in fatal] == ["stop"]
    assert failures[0].error == "KeyError: 'gen'" and not failures[0].restarting
    assert failures[0].fatal


def test_a_failing_report_does_not_break_the_supervisor():
    async def scenario():
        def bad_report(failure):
            raise OSError("journal disk full")

        fatal = asyncio.Event()
        sup = TaskSupervisor(on_failure=bad_report, on_fatal=lambda f: fatal.set())

        async def fails():
            raise ValueError("x")

        sup.spawn("x", fails())
        await asyncio.wait_for(fatal.wait(), 5)

    run(scenario())
