"""The transports by name (ftrun/transport/registry.py) and the one escalation ladder
(ftrun/transport/escalate.py): capabilities asked, not names compared; each step its share."""

from __future__ import annotations

import asyncio
import time

import pytest

from ftrun.errors import UsageError
from ftrun.transport.escalate import escalate
from ftrun.transport.registry import BACKENDS, backend


def test_every_transport_says_what_it_can_do():
    assert set(BACKENDS) == {"local", "ssh", "slurm"}
    local, ssh, slurm = backend("local"), backend("ssh"), backend("slurm")
    assert (local.remote, ssh.remote, slurm.remote) == (False, True, True)
    assert [b.name for b in BACKENDS.values() if b.checks_host_keys] == ["ssh"]
    # srun ends the agents with the batch step: no grace to wait out for an adopter
    assert [b.name for b in BACKENDS.values() if not b.agents_wait_for_controller] == ["slurm"]
    assert local.resume_problem("job-1") is None and ssh.resume_problem("job-1") is None


def test_an_unknown_transport_is_one_message():
    with pytest.raises(UsageError, match="no transport 'mpi' \\(one of local, ssh, slurm\\)"):
        backend("mpi")


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_the_first_nudge_that_ends_it_is_the_last_tried():
    tried: list[str] = []

    async def go() -> bool:
        done = asyncio.Event()

        def close_stdin() -> None:
            tried.append("close")
            done.set()

        def sigterm() -> None:
            tried.append("term")

        return await escalate(done.wait, [None, close_stdin, sigterm], 3.0)

    assert run(go()) is True
    assert tried == ["close"]


def test_each_step_has_its_share_and_the_whole_stays_within_the_timeout():
    tried: list[float] = []

    async def go() -> bool:
        never = asyncio.Event()
        t0 = time.monotonic()

        async def slow_nudge() -> None:  # a nudge that cannot be delivered (a stuck channel)
            tried.append(time.monotonic() - t0)
            await asyncio.sleep(5)

        return await escalate(never.wait, [None, slow_nudge], 0.4)

    t0 = time.monotonic()
    assert run(go()) is False
    elapsed = time.monotonic() - t0
    assert len(tried) == 1 and tried[0] >= 0.15  # only after the first share (0.2 s)
    assert elapsed < 3  # the stuck nudge is given its share (0.2 s), not its 5 s
