"""The profile contract: valid documents load and round-trip; a bad one names every problem."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ftrun.errors import EXIT_USAGE
from ftrun.planner import InvalidProfile, Links, Profile, format_bytes, parse_size
from ftrun.planner.profile import DEFAULT_P2P_BYTES_PER_S

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "profile_gpt_small.json"


def document() -> dict[str, Any]:
    return json.loads(SAMPLE.read_text())


def test_the_sample_loads_and_round_trips() -> None:
    profile = Profile.from_dict(document())
    assert len(profile.layers) == 10
    assert profile.layer_names[0] == "tok" and profile.layer_names[-1] == "head"
    assert profile.global_batch == 512 and profile.device_memory_bytes == 16 * 1024**3
    assert Profile.from_dict(profile.to_dict()) == profile
    assert Profile.from_dict(json.loads(json.dumps(profile.to_dict()))) == profile


def test_missing_links_take_the_defaults_and_unknown_keys_are_ignored() -> None:
    d = document()
    d["links"] = {"p2p_latency_s": 0.001}
    d["extra"] = "ignored"
    d["layers"][0]["extra"] = 1
    links = Profile.from_dict(d).links
    assert links.p2p_latency_s == 0.001
    assert links.p2p_bytes_per_s == DEFAULT_P2P_BYTES_PER_S == Links().p2p_bytes_per_s
    del d["links"]
    assert Profile.from_dict(d).links == Links()


def test_gradient_bytes_default_to_a_quarter_of_the_state() -> None:
    d = document()
    layer = Profile.from_dict(d).layers[1]
    assert layer.gradient_bytes == layer.state_bytes // 4
    d["layers"][1]["grad_bytes"] = 123
    assert Profile.from_dict(d).layers[1].gradient_bytes == 123


def test_every_problem_is_named_at_once() -> None:
    d = document()
    d["version"] = 2
    d["global_batch"] = 0
    d["layers"][0]["fwd_s"] = [0.1]
    d["layers"][1]["state_bytes"] = -1
    d["layers"][2]["name"] = "tok"
    d["links"]["p2p_bytes_per_s"] = 0
    with pytest.raises(InvalidProfile) as caught:
        Profile.from_dict(d, source="p.json")
    e = caught.value
    assert e.exit_code == EXIT_USAGE
    assert e.message.startswith("p.json has 6 problems: ")
    for part in (
        "version is 2",
        "global_batch is 0",
        "layers[0] (tok).fwd_s",
        "layers[1] (block0).state_bytes is -1",
        "layer names appear twice: tok",
        "links.p2p_bytes_per_s is 0",
    ):
        assert part in e.message
    assert "docs/planner.md" in e.hint


@pytest.mark.parametrize(
    "d",
    [[], {"version": 1}, {"version": 1, "layers": []}, {"version": 1, "layers": [3]}],
)
def test_shapes_that_are_not_profiles(d: Any) -> None:
    with pytest.raises(InvalidProfile):
        Profile.from_dict(d)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("16GiB", 16 * 1024**3),
        ("512MiB", 512 * 1024**2),
        ("1.5 GiB", 3 * 1024**3 // 2),
        ("4GB", 4_000_000_000),
        ("1073741824", 1024**3),
        ("1e9", 1_000_000_000),
        ("2k", 2048),  # a bare K/M/G is binary, as `ulimit` reads it
    ],
)
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(
    "text", ["", "GiB", "16XB", "-1GiB", "0", "1.2.3", "1e999", "2EiB", "9e18TiB"]
)
def test_bad_sizes(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


def test_format_bytes() -> None:
    assert format_bytes(100) == "100 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(16 * 1024**3) == "16.0 GiB"


def test_optimizer_seconds_and_the_devices_reduce_rate_are_optional() -> None:
    d = document()
    assert Profile.from_dict(d).reduce_bytes_per_s is None  # not profiled: not counted
    assert Profile.from_dict(d).layers[0].opt_s == 0.0
    d["layers"][0]["opt_s"] = 0.002
    d["device"] = {"reduce_bytes_per_s": 4e8, "cpu_share": 0.4}  # cpu_share: a note, ignored
    profile = Profile.from_dict(d)
    assert profile.layers[0].opt_s == 0.002 and profile.reduce_bytes_per_s == 4e8
    assert Profile.from_dict(json.loads(json.dumps(profile.to_dict()))) == profile
    d["layers"][1]["opt_s"] = -1
    d["device"] = {"reduce_bytes_per_s": 0}
    with pytest.raises(InvalidProfile) as caught:
        Profile.from_dict(d)
    assert "layers[1] (block0).opt_s is -1" in caught.value.message
    assert "device.reduce_bytes_per_s is 0" in caught.value.message
