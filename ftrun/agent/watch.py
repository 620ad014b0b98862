"""The agent's timed loops over whichever generation runs here: the tail loop (the ranks' new
output, a hang reported once, the job's step now and then) and the idle loop (the zero-config
hang guard, idle.py). What each finds is the generation's to act on (genrun.py); the decisions
on hangs and idleness are the controller's (controller/stall.py).

They run for the agent's whole life, not per generation, and read the current one at each tick
(`current()`), so a generation that ends between ticks is simply no longer watched. The agent
starts them under its TaskSupervisor, which restarts a loop that raised.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ftrun.agent.genrun import GenerationRun
from ftrun.agent.link import ControlLink
from ftrun.agent.stallguard import StallGuard
from ftrun.tasks import TaskSupervisor

log = logging.getLogger("ftrun.agent")

TAIL_INTERVAL_S = 0.05
PROGRESS_FLUSH_INTERVAL_S = 0.5
IDLE_OFF_INTERVAL_S = 0.5  # how often the idle loop looks again while no guard is on


async def tail_loop(current: Callable[[], GenerationRun | None], tasks: TaskSupervisor) -> None:
    """Forward the ranks' new output, give a rank whose handler came late the preemption
    notice, report a hang once (stacks first: a task, so the tail keeps flowing meanwhile), and
    send the job's step at most every PROGRESS_FLUSH_INTERVAL_S."""
    last_progress = 0.0
    check = StallGuard()  # a hang is judged by silence: not right after we were stalled
    while True:
        run = current()
        due = check.due()
        if run is not None:
            run.flush_logs()
            run.deliver_notice()
            now = time.monotonic()
            if due and (overdue := run.newly_overdue(now)):
                tasks.spawn("hang report", run.report_hang(overdue, detected_t=time.time()))
            if run.steps_dirty and now - last_progress >= PROGRESS_FLUSH_INTERVAL_S:
                last_progress = now
                run.send_progress()
        await check.sleep(TAIL_INTERVAL_S)


async def idle_loop(current: Callable[[], GenerationRun | None], link: ControlLink) -> None:
    """Sample CPU and output of the live ranks; tell the controller when every one of them has
    been idle for a while, and when that stops."""
    while True:
        run = current()
        guard = run.idle_guard if run is not None else None
        if run is None or guard is None:
            await asyncio.sleep(IDLE_OFF_INTERVAL_S)
            continue
        try:
            news = await run.sample_idle(guard)
            if news is not None and current() is run:
                link.send("idle", **news)
        except Exception:
            log.exception("idle guard: sampling failed")
        await asyncio.sleep(guard.interval_s)
