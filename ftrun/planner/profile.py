"""The model profile the planner reads: per-layer time and memory, and the links between slots.

Owns the profile.json contract (docs/planner.md): `Profile.from_dict` checks a document written
by `ftrun profile` (or by hand) and reports every problem in one error, so a user fixes the file
once; `to_dict` writes the same keys back. Unknown keys are ignored, as the contract says.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from ftrun.errors import UsageError

PROFILE_VERSION = 1

# Link figures used when the profile has none: roughly a 10 Gb/s Ethernet between hosts as NCCL
# or gloo see it over TCP (~1 GB/s achieved of 1.25 GB/s line rate), with the latency of a small
# collective (0.5 ms: a ring's handshake per step) and of one send/recv pair (0.2 ms). They are the
# contract's example figures and deliberately modest: a plan made with them never counts on a
# fabric the cluster may not have. `ftrun profile` measures the real ones when it can.
DEFAULT_ALLREDUCE_BYTES_PER_S = 1.0e9
DEFAULT_ALLREDUCE_LATENCY_S = 0.0005
DEFAULT_P2P_BYTES_PER_S = 1.0e9
DEFAULT_P2P_LATENCY_S = 0.0002

# Gradient bytes when a layer gives none: Adam with fp32 master weights keeps 16 bytes a parameter
# (weights, gradients, two moments), of which the gradient all-reduced over DP is 4.
DEFAULT_GRAD_FRACTION = 0.25


class InvalidProfile(UsageError):
    """A profile document that breaks the contract; the message lists every problem."""


@dataclass(frozen=True, kw_only=True)
class LayerProfile:
    """One pipeline unit: time of one micro-batch of m samples is a + b·m; memory in bytes."""

    name: str
    fwd_s: tuple[float, float]
    bwd_s: tuple[float, float]
    state_bytes: int
    act_bytes: int
    out_bytes: int
    grad_bytes: int | None = None  # optional in the contract; see DEFAULT_GRAD_FRACTION
    opt_s: float = 0.0  # one optimizer step over its parameters; optional (0: not profiled)

    def time_s(self, m: int) -> float:
        """Forward plus backward of one micro-batch of m samples."""
        return self.fwd_s[0] + self.fwd_s[1] * m + self.bwd_s[0] + self.bwd_s[1] * m

    @property
    def gradient_bytes(self) -> int:
        if self.grad_bytes is not None:
            return self.grad_bytes
        return int(self.state_bytes * DEFAULT_GRAD_FRACTION)


@dataclass(frozen=True, kw_only=True)
class Links:
    """Bandwidth (bytes/s) and latency (s) of the DP all-reduce and of stage-to-stage sends."""

    allreduce_bytes_per_s: float = DEFAULT_ALLREDUCE_BYTES_PER_S
    allreduce_latency_s: float = DEFAULT_ALLREDUCE_LATENCY_S
    p2p_bytes_per_s: float = DEFAULT_P2P_BYTES_PER_S
    p2p_latency_s: float = DEFAULT_P2P_LATENCY_S


@dataclass(frozen=True, kw_only=True)
class Profile:
    """A model's layers in forward order, its batch and memory budget if known, its links, and
    the bytes a second a device reduces in the DP all-reduce (None: not profiled, not counted)."""

    model: str
    layers: tuple[LayerProfile, ...]
    global_batch: int | None = None
    device_memory_bytes: int | None = None
    links: Links = field(default_factory=Links)
    reduce_bytes_per_s: float | None = None

    @property
    def layer_names(self) -> tuple[str, ...]:
        return tuple(layer.name for layer in self.layers)

    @classmethod
    def from_dict(cls, d: Any, *, source: str = "the profile") -> Profile:
        """Checks `d` against the contract; raises InvalidProfile naming every problem."""
        problems: list[str] = []
        if not isinstance(d, Mapping):
            raise InvalidProfile(f"{source} is not a JSON object", hint=_HINT)
        if d.get("version") != PROFILE_VERSION:
            problems.append(f"version is {d.get('version')!r}, not {PROFILE_VERSION}")
        model = d.get("model", "")
        if not isinstance(model, str):
            problems.append("model is not a string")
            model = ""
        global_batch = _optional_count(d, "global_batch", problems)
        memory = _optional_count(d, "device_memory_bytes", problems)
        raw_layers = d.get("layers")
        layers: list[LayerProfile] = []
        if not isinstance(raw_layers, list) or not raw_layers:
            problems.append("layers is missing or not a non-empty list")
        else:
            for i, raw in enumerate(raw_layers):
                layer = _layer(raw, i, problems)
                if layer is not None:
                    layers.append(layer)
            given = [r.get("name") for r in raw_layers if isinstance(r, Mapping)]
            names: list[str] = [n for n in given if isinstance(n, str) and n]
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                problems.append(f"layer names appear twice: {', '.join(twice)}")
        links = _links(d.get("links"), problems)
        reduce = _reduce(d.get("device"), problems)
        if problems:
            raise InvalidProfile(
                f"{source} has {len(problems)} problem{'s' if len(problems) > 1 else ''}: "
                + "; ".join(problems),
                hint=_HINT,
                data={"problems": problems},
            )
        return cls(
            model=model,
            layers=tuple(layers),
            global_batch=global_batch,
            device_memory_bytes=memory,
            links=links,
            reduce_bytes_per_s=reduce,
        )

    def to_dict(self) -> dict[str, Any]:
        """The profile.json document (the keys of the contract; grad_bytes only where given)."""
        layers = []
        for layer in self.layers:
            row: dict[str, Any] = {
                "name": layer.name,
                "fwd_s": list(layer.fwd_s),
                "bwd_s": list(layer.bwd_s),
                "state_bytes": layer.state_bytes,
                "act_bytes": layer.act_bytes,
                "out_bytes": layer.out_bytes,
            }
            if layer.grad_bytes is not None:
                row["grad_bytes"] = layer.grad_bytes
            if layer.opt_s:
                row["opt_s"] = layer.opt_s
            layers.append(row)
        links = self.links
        device = (
            {}
            if self.reduce_bytes_per_s is None
            else {"reduce_bytes_per_s": self.reduce_bytes_per_s}
        )
        return {
            "version": PROFILE_VERSION,
            "model": self.model,
            "global_batch": self.global_batch,
            "device_memory_bytes": self.device_memory_bytes,
            "layers": layers,
            "device": device,
            "links": {
                "allreduce_bytes_per_s": links.allreduce_bytes_per_s,
                "allreduce_latency_s": links.allreduce_latency_s,
                "p2p_bytes_per_s": links.p2p_bytes_per_s,
                "p2p_latency_s": links.p2p_latency_s,
            },
        }


_HINT = "docs/planner.md describes profile.json; `ftrun profile` writes one from the script"


def _is_number(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _optional_count(d: Mapping[str, Any], key: str, problems: list[str]) -> int | None:
    value = d.get(key)
    if value is None:
        return None
    if not _is_number(value) or value != int(value) or value <= 0:
        problems.append(f"{key} is {value!r}, not a positive integer or null")
        return None
    return int(value)


def _layer(raw: Any, i: int, problems: list[str]) -> LayerProfile | None:
    where = f"layers[{i}]"
    if not isinstance(raw, Mapping):
        problems.append(f"{where} is not an object")
        return None
    before = len(problems)
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        problems.append(f"{where}.name is missing or empty")
    else:
        where = f"layers[{i}] ({name})"
    times: dict[str, tuple[float, float]] = {}
    for key in ("fwd_s", "bwd_s"):
        pair = raw.get(key)
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not all(_is_number(x) and x >= 0 for x in pair)
        ):
            problems.append(f"{where}.{key} is {pair!r}, not [a, b] with a, b >= 0 seconds")
        else:
            times[key] = (float(pair[0]), float(pair[1]))
    sizes: dict[str, int] = {}
    for key in ("state_bytes", "act_bytes", "out_bytes", "grad_bytes"):
        value = raw.get(key)
        if value is None and key == "grad_bytes":
            continue
        if not _is_number(value) or value < 0 or value != int(value):
            problems.append(f"{where}.{key} is {value!r}, not a byte count >= 0")
        else:
            sizes[key] = int(value)
    opt_s = raw.get("opt_s", 0.0)
    if not _is_number(opt_s) or opt_s < 0:
        problems.append(f"{where}.opt_s is {opt_s!r}, not a number >= 0 seconds")
    if len(problems) > before:
        return None
    assert isinstance(name, str)
    return LayerProfile(
        name=name,
        fwd_s=times["fwd_s"],
        bwd_s=times["bwd_s"],
        state_bytes=sizes["state_bytes"],
        act_bytes=sizes["act_bytes"],
        out_bytes=sizes["out_bytes"],
        grad_bytes=sizes.get("grad_bytes"),
        opt_s=float(opt_s),
    )


def _reduce(raw: Any, problems: list[str]) -> float | None:
    """device.reduce_bytes_per_s (optional; other keys of `device` are the profiler's notes)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        problems.append("device is not an object")
        return None
    value = raw.get("reduce_bytes_per_s")
    if value is None:
        return None
    if not _is_number(value) or value <= 0:
        problems.append(f"device.reduce_bytes_per_s is {value!r}, not a number > 0 bytes/s")
        return None
    return float(value)


def _links(raw: Any, problems: list[str]) -> Links:
    if raw is None:
        return Links()
    if not isinstance(raw, Mapping):
        problems.append("links is not an object")
        return Links()
    given: dict[str, float] = {}
    for key in vars(Links()):
        value = raw.get(key)
        if value is None:
            continue
        bandwidth = key.endswith("bytes_per_s")
        if not _is_number(value) or value < 0 or (bandwidth and value == 0):
            need = "> 0 bytes/s" if bandwidth else ">= 0 seconds"
            problems.append(f"links.{key} is {value!r}, not a number {need}")
        else:
            given[key] = float(value)
    return Links(**given)
