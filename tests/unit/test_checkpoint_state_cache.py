"""TrainState.state_dict() reuses DCP's state dict between saves (state_cache.py): whatever the
model and optimizer went through, what it returns must equal what torch's get_state_dict makes
at that moment, entry for entry, the tensors being the very same storage."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

import ftrun.checkpoint as ckpt
from ftrun.checkpoint.state import RNG_KEY, flatten


def torch_made(ts: ckpt.TrainState) -> dict[str, Any]:
    model_sd, optim_sd = get_state_dict(
        ts.model, ts.optimizers, options=StateDictOptions(flatten_optimizer_state_dict=True)
    )
    return {"model": model_sd, "optim": optim_sd}


def assert_same_state(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got.keys() == want.keys()
    for part in want:
        assert got[part].keys() == want[part].keys(), part
        for name, value in want[part].items():
            mine = got[part][name]
            if isinstance(value, torch.Tensor):
                assert isinstance(mine, torch.Tensor), name
                assert mine.data_ptr() == value.data_ptr(), f"{name}: another storage"
                assert torch.equal(mine, value), name
            else:
                assert mine == value, name


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4))
        self.norm = nn.BatchNorm1d(4)  # buffers, updated in place

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.body(x))


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: int, sched: Any = None) -> None:
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(6, 8)).square().mean().backward()
        opt.step()
        if sched is not None:
            sched.step()


def make() -> tuple[nn.Module, torch.optim.Optimizer, ckpt.TrainState]:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(
        [
            {"params": model.body.parameters(), "lr": 1e-2},
            {"params": model.norm.parameters(), "lr": 1e-3, "weight_decay": 0.0},
        ]
    )
    return model, opt, ckpt.TrainState(model, opt)


def test_it_follows_training_and_a_scheduler_between_calls():
    model, opt, ts = make()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    train(model, opt, 1)
    ts.state_dict()  # made by torch, and cached
    for _ in range(3):
        train(model, opt, 2, sched)  # new values in place, a new lr every step
        got = ts.state_dict()
        assert ts._cached is not None and got is not ts.state_dict()  # a fresh dict each call
        assert_same_state(got, torch_made(ts))
    assert got["optim"]["param_groups.body.0.weight.lr"] == pytest.approx(1e-2 * 0.5**6)


def test_loading_the_optimizer_state_or_moving_a_parameter_is_noticed():
    model, opt, ts = make()
    train(model, opt, 2)
    ts.state_dict()
    opt.load_state_dict(opt.state_dict())  # new state tensors, equal values
    assert_same_state(ts.state_dict(), torch_made(ts))
    model.body[0].weight.data = model.body[0].weight.data.clone()  # another storage
    assert_same_state(ts.state_dict(), torch_made(ts))
    model.body.append(nn.Linear(4, 4))  # a new parameter, in no optimizer
    assert_same_state(ts.state_dict(), torch_made(ts))


class WithExtraState(nn.Linear):
    calls = 0

    def get_extra_state(self) -> dict[str, int]:
        WithExtraState.calls += 1
        return {"calls": WithExtraState.calls}

    def set_extra_state(self, state: Any) -> None:
        pass


def test_what_it_cannot_trace_is_made_by_torch_every_time():
    model = nn.Sequential(WithExtraState(4, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ts = ckpt.TrainState(model, opt)
    train_one = lambda: model(torch.randn(2, 4)).sum().backward() or opt.step()  # noqa: E731
    train_one()
    first = ts.state_dict()["model"]["0._extra_state"]
    train_one()
    assert ts._cached is None
    assert ts.state_dict()["model"]["0._extra_state"] != first


def leaves(flat: Any) -> tuple[list[tuple[str, int, torch.Tensor]], list[tuple[str, Any]]]:
    tensors = [(leaf.key, leaf.tensor.data_ptr(), leaf.tensor.clone()) for leaf in flat.tensors]
    return tensors, [(leaf.key, leaf.value) for leaf in flat.objects if leaf.key != RNG_KEY]


def assert_same_leaves(state: dict[str, Any]) -> None:
    """save()'s flattening (TrainState's cached leaves) is the one restore() walks, in order."""
    (got_t, got_o), (want_t, want_o) = leaves(flatten(state, saving=True)), leaves(flatten(state))
    assert [(k, p) for k, p, _ in got_t] == [(k, p) for k, p, _ in want_t]
    assert all(torch.equal(a, b) for (_, _, a), (_, _, b) in zip(got_t, want_t, strict=True))
    assert got_o == want_o


def test_saves_read_the_cached_leaves_as_they_are_at_each_save():
    model, opt, ts = make()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    state = {"train": ts, "extra": {"epoch": 1}}
    train(model, opt, 1)
    assert_same_leaves(state)
    before = flatten(state, saving=True)
    train(model, opt, 2, sched)  # new values in place, new learning rates
    state["extra"]["epoch"] = 2
    assert_same_leaves(state)
    lr = [
        leaf.value
        for leaf in before.objects
        if leaf.key == "train.optim.param_groups.body.0.weight.lr"
    ]
    assert lr == [pytest.approx(1e-2 * 0.5**2)]  # a leaf made earlier reads the live value
    opt.param_groups[0]["lr"] = torch.tensor(0.5)  # a value turned tensor: a tensor leaf now
    assert_same_leaves(state)
    assert "train.optim.param_groups.body.0.weight.lr" in [
        t.key for t in flatten(state, saving=True).tensors
    ]
    model.body[0].weight.data = model.body[0].weight.data.clone()  # another storage
    assert_same_leaves(state)


def test_a_state_it_cannot_cache_is_walked_when_saving_too():
    model = nn.Sequential(WithExtraState(4, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    state = {"train": ckpt.TrainState(model, opt)}
    keys = [leaf.key for leaf in flatten(state, saving=True).objects]
    assert "train.model.0._extra_state.calls" in keys
