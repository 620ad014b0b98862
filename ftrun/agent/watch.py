"""The agent's timed loops over whichever generation runs here: the tail loop (the ranks' new
output, the job's step now and then) and the evidence loop (what the ranks are doing: the
zero-config hang guard, idle.py, and the evidence a hang verdict needs, verdict.py). What each
finds is the generation's to act on (genrun.py); the job-wide decisions on hangs and idleness
are the controller's (controller/stall.py).

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
IDLE_OFF_INTERVAL_S = 0.5  # how often the evidence loop looks again between samples


async def tail_loop(current: Callable[[], GenerationRun | None]) -> None:
    """Forward the ranks' new output, give a rank whose handler came late the preemption
    notice, and send the job's step at most every PROGRESS_FLUSH_INTERVAL_S."""
    last_progress = 0.0
    while True:
        run = current()
        if run is not None:
            run.flush_logs()
            run.deliver_notice()
            now = time.monotonic()
            run.paces.update(run.pace.sample(now))  # windows a tick's read finished
            if run.steps_dirty and now - last_progress >= PROGRESS_FLUSH_INTERVAL_S:
                last_progress = now
                run.send_progress()
            if run.paces:
                run.send_pace()
        await asyncio.sleep(TAIL_INTERVAL_S)


async def evidence_loop(
    current: Callable[[], GenerationRun | None], link: ControlLink, tasks: TaskSupervisor
) -> None:
    """Sample CPU, output and state of the live ranks while that is evidence anyone needs (a
    rank nearing its hang allowance, or the idle guard); tell the controller when every rank
    here has been idle, or waiting past an allowance, and when that stops; report a local hang
    verdict once (stacks first: a task, so sampling goes on meanwhile)."""
    check = StallGuard()  # a verdict is not given right after our own loop was stalled
    last_sample = 0.0
    while True:
        run = current()
        now = time.monotonic()
        interval = run.sample_interval(now) if run is not None else None
        # Looked at every IDLE_OFF_INTERVAL_S at most, so a rank that nears its allowance is
        # sampled soon, but sampled (a pass over the process table) only as often as needed.
        if run is None or interval is None or now - last_sample < interval:
            await check.sleep(min(IDLE_OFF_INTERVAL_S, interval or IDLE_OFF_INTERVAL_S))
            continue
        last_sample = now
        due = check.due()
        try:
            found, news = await run.sample_evidence()
            if current() is run:
                if news is not None:
                    link.send("idle", **news)
                if found is not None and due and not run.hang_reported:
                    run.hang_reported = True
                    tasks.spawn("hang report", run.report_hang(found, detected_t=time.time()))
        except Exception:
            log.exception("hang evidence: sampling failed")
        await check.sleep(min(IDLE_OFF_INTERVAL_S, interval))
