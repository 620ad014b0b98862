"""ftrun.parallel.profile times a device at its sustained speed: each layer's share from its
fastest run, the total from the mean over passes that span many scheduler periods."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from ftrun.parallel import profile


def run(
    fwd: list[float], bwd: list[float]
) -> tuple[list[float], list[float], list[int], list[int]]:
    return fwd, bwd, [0] * len(fwd), [0] * len(fwd)


def test_each_layers_share_from_its_fastest_run_and_the_total_from_the_mean():
    # Two identical layers on a device held to a share of a core: each pass, one layer or the
    # other is stalled (+6 ms) — a median of either would be a lottery, the fastest is not.
    runs = [
        run([0.001, 0.001], [0.002 + 0.006, 0.002]),
        run([0.001, 0.001 + 0.006], [0.002, 0.002]),
        run([0.001, 0.001], [0.002, 0.002 + 0.006]),
    ]
    fwd, bwd = profile._sustained(runs)
    # Fastest: 1 + 1 + 2 + 2 = 6 ms; the mean pass: 6 + 6 = 12 ms: every figure x2.
    assert fwd == pytest.approx([0.002, 0.002]) and bwd == pytest.approx([0.004, 0.004])
    # A device that never stalls: the figures are the runs'.
    same = profile._sustained([run([0.001, 0.003], [0.002, 0.004])] * 4)
    assert same == (pytest.approx([0.001, 0.003]), pytest.approx([0.002, 0.004]))


def test_passes_are_repeated_until_they_span_the_minimum_time(monkeypatch):
    layers = [nn.Linear(4, 4), nn.Linear(4, 4)]

    def samples(start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(n, 4), torch.randn(n, 4)

    calls: list[int] = []
    real = profile._one_pass

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(profile, "_one_pass", counted)
    figures = profile.measure(
        layers, samples, nn.functional.mse_loss, (1, 2), torch.device("cpu"),
        warmup=1, repeats=3, min_timed_s=0.0,
    )  # fmt: skip
    assert len(calls) == 2 * (1 + 3)  # no minimum time: the repeats asked for
    calls.clear()
    profile.measure(
        layers, samples, nn.functional.mse_loss, (1, 2), torch.device("cpu"),
        warmup=1, repeats=3, min_timed_s=0.05,
    )  # fmt: skip
    assert len(calls) > 2 * (1 + 3)  # tiny layers: many more passes to fill 50 ms
    assert len(figures) == 2 and all(f["fwd_s"][0] >= 0 for f in figures)
