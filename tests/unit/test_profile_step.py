"""ftrun.parallel.profile_step: what a step costs beyond its layers, timed in one process —
an optimizer step per layer and the device's own work in a DP all-reduce."""

from __future__ import annotations

import itertools
import threading

import pytest
import torch.nn as nn

from ftrun.parallel import profile_step


def test_each_parts_share_from_its_fastest_run_and_the_total_from_the_mean() -> None:
    # Two equal parts; a stall (+4 ms) falls on one or the other: fastest 1 + 1 ms, mean 4 ms.
    runs = [[0.001 + 0.004, 0.001], [0.001, 0.001 + 0.004], [0.001, 0.001]]
    mean = (0.006 + 0.006 + 0.002) / 3
    assert profile_step.sustained(runs) == pytest.approx([mean / 2, mean / 2])


def test_cpu_share_is_cpu_over_wall_at_most_one_core() -> None:
    assert profile_step.cpu_share(0.4, 1.0) == pytest.approx(0.4)
    assert profile_step.cpu_share(3.0, 1.5) == 1.0  # threads on several cores: one device
    assert profile_step.cpu_share(0.0, 1.0) == 1.0  # nothing measured: taken as a whole core


def test_optimizer_seconds_per_layer() -> None:
    layers = [nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)]
    seconds = profile_step.optimizer_seconds(layers, min_timed_s=0.0, repeats=3)
    assert len(seconds) == 3 and seconds[1] == 0.0  # no parameters, no step
    assert seconds[0] > 0 and seconds[2] > 0
    assert all(p.grad is None for layer in layers for p in layer.parameters())


def test_reduce_rate_from_a_ranks_cpu_at_the_devices_share() -> None:
    # A clock that says 0.12 s of CPU passed over the 3 timed all-reduces: 0.02 s a rank
    # (the process ran both), 0.05 s at 0.4 of a core; 4 MB a rank in that time: 80 MB/s.
    ticks = itertools.chain([0.0], itertools.repeat(0.12))
    rate = profile_step.reduce_bytes_per_s(
        4_000_000, 0.4, min_timed_s=0.0, repeats=3, clock=lambda: next(ticks)
    )
    assert rate == pytest.approx(4_000_000 / 0.05)
    assert profile_step.reduce_bytes_per_s(0, 0.4) is None


def test_a_real_two_rank_all_reduce_leaves_no_thread_behind() -> None:
    before = threading.active_count()
    rate = profile_step.reduce_bytes_per_s(1 << 20, 1.0, min_timed_s=0.0, repeats=2)
    assert rate is not None and rate > 1e6  # MB/s at least, on any CPU
    assert threading.active_count() == before
