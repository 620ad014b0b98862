"""ftrun.checkpoint state handling: fully-qualified names, per-rank state, RNG, slot layout."""

from __future__ import annotations

import random

import pytest
import torch

import ftrun.checkpoint as ckpt
from ftrun.checkpoint import slots
from ftrun.checkpoint.state import RNG_KEY, apply, capture_rng, flatten, restore_rng, storage_key
from tests.integration.ckpt_helpers import Toy


def test_names_are_fully_qualified_and_optimizer_state_is_keyed_by_parameter():
    toy = Toy()
    toy.step()  # optimizer state exists
    flat = flatten(toy.state)
    tensors = {leaf.key for leaf in flat.tensors}
    assert {
        "train.model.0.weight",
        "train.model.2.bias",
        "train.optim.state.0.weight.exp_avg",
        "train.optim.state.2.bias.step",
    } <= tensors
    objects = {leaf.key: leaf for leaf in flat.objects}
    assert objects["train.optim.param_groups.0.weight.lr"].value == 0.05
    assert objects["extra.epoch"].value == 1 and not objects["extra.epoch"].local
    assert objects["data.position"].local and objects[RNG_KEY].local
    assert flat.optimizers() == [toy.opt]


def test_per_rank_tensors_get_rank_qualified_storage_names():
    flat = flatten({"a": {"t": torch.zeros(2)}, "b": ckpt.PerRank({"t": torch.ones(2)})}, rng=False)
    assert [storage_key(leaf, 3) for leaf in flat.tensors] == ["a.t", "__rank3__.b.t"]


def test_apply_puts_objects_back_and_calls_load_state_dict_last():
    toy = Toy()
    flat = flatten(toy.state)
    apply(flat, {"extra.epoch": 9, "data.position": 5})
    assert toy.extra["epoch"] == 9 and toy.loader.position == 5


def test_rng_round_trip_covers_python_and_torch():
    state = capture_rng()
    draws = (random.random(), torch.rand(3))
    restore_rng(state)
    again = (random.random(), torch.rand(3))
    assert draws[0] == again[0] and torch.equal(draws[1], again[1])


def test_rng_states_of_older_checkpoints_as_tensors_still_restore():
    state = {**capture_rng(), "torch": torch.get_rng_state()}  # as saved before 2026-11-26
    assert isinstance(capture_rng()["torch"], bytes)
    draw = torch.rand(3)
    restore_rng(state)
    assert torch.equal(torch.rand(3), draw)


def test_slot_layout_is_aligned_and_the_signature_tracks_shapes():
    tensors = [
        ("a", torch.zeros(3)),
        ("b", torch.zeros(5, dtype=torch.float64)),
        ("c", torch.zeros(0)),
    ]
    entries, size = slots.layout(tensors)
    assert [e.offset % slots.ALIGN for e in entries] == [0, 0, 0]
    assert entries[1].nbytes == 40 and size % slots.ALIGN == 0 and size >= entries[1].offset + 40
    same = slots.signature(entries, 2)
    assert slots.signature(slots.layout(tensors)[0], 2) == same
    assert slots.signature(entries, 4) != same
    assert slots.signature(slots.layout([("a", torch.zeros(4))] + tensors[1:])[0], 2) != same


def test_state_must_be_a_mapping():
    with pytest.raises(ckpt.StateError) as err:
        flatten([1, 2])  # type: ignore[arg-type]
    assert err.value.hint
