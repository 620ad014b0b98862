"""What `ftrun launch` says about the checkpoint memory tier's room (controller/shm_notes.py)."""

from __future__ import annotations

import dataclasses

from ftrun.controller.shm_notes import hello_note, tier_note
from ftrun.wire.inbound import CheckpointTier, Hello

MIB = 2**20


def test_a_small_dev_shm_is_named_at_launch_with_its_figures():
    note = hello_note("node3", Hello(agent_id="node3#0", shm_free=60 * MIB, shm_total=64 * MIB))
    assert note is not None
    assert note.startswith("node3: /dev/shm has 60 MiB free of 64 MiB")
    assert "3 x each rank's state" in note and "storage only" in note


def test_a_roomy_or_unreported_dev_shm_says_nothing():
    assert hello_note("h", Hello(agent_id="h#0", shm_free=8 << 30, shm_total=16 << 30)) is None
    assert hello_note("h", Hello(agent_id="h#0")) is None  # an older agent


def test_a_step_down_is_said_with_the_figures():
    msg = CheckpointTier(
        gen=1,
        rank=3,
        from_="live",
        tier="copies",
        why="cannot reserve 200 MiB",
        need=600 * MIB,
        free=80 * MIB,
        total=480 * MIB,
    )
    assert tier_note("node1", msg) == (
        "node1 rank 3: the checkpoint memory tier steps down from live to copies "
        "(needs up to 600 MiB; /dev/shm has 80 MiB free of 480 MiB): cannot reserve 200 MiB"
    )
    assert "needs" not in tier_note("node1", dataclasses.replace(msg, need=0))
