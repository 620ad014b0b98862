"""The cost model: a layout's predicted step time and its memory per pipeline rank.

Step time, after Varuna (Athlur et al., EuroSys '22), with every figure from the profile:

    step = compute + bubble + allreduce + p2p + reduce + optimizer + loss
    compute   = M × T            T: the slowest pipeline rank's forward + backward of one
                                 micro-batch of m samples (Σ over its layers of a + b·m)
    bubble    = (PP − 1) × t     t: the slowest virtual stage; = T for GPipe and 1F1B, about
                                 T / v for Interleaved1F1B with v stages per rank
    allreduce = 2(DP − 1)/DP × G / bw_ar + 2(DP − 1) × lat_ar     (ring; 0 when DP = 1)
                                 G: the gradient bytes of the rank that holds the most
    p2p       = 2 × Σ over the stage boundaries of (m × out_bytes / bw_p2p + lat_p2p)
    reduce    = 2(DP − 1)/DP × G / reduce_bytes_per_s        (0 when DP = 1 or not profiled)
                                 the device's own work in the all-reduce: gloo reduces on the
                                 rank's CPU (its copies, sums, TCP stack), which the links' wire
                                 figures leave out; profiled on the device (parallel/profile_step)
    optimizer = the slowest pipeline rank's Σ of its layers' opt_s: one optimizer step, once a step
    loss      = 2⌈log2(DP·PP)⌉ × lat_ar                      (0 when DP·PP = 1)
                                 the step's mean loss, all-reduced over every rank after the
                                 optimizer step (ftrun.parallel's Parallel.step returns it on
                                 every rank): one number, latency alone, up a tree and back
                                 down (a ring's 2(N − 1) steps would be the worst case)

(M + PP − 1) × T is Varuna's pipeline time. Sends in the steady state overlap compute
(torch.distributed.pipelining posts them asynchronously), so only one micro-batch's way through
the pipeline and back — the fill and the drain — is on the critical path: each boundary once
forward (the activation) and once backward (its gradient, the same size). The all-reduce is
counted after the last backward, not overlapped, as Varuna does; an overlapped one only makes
the real step faster than predicted. The optimizer step follows the all-reduce on every rank.

Memory of pipeline rank p: its layers' state_bytes, plus the activations it holds for backward,
in_flight × m × Σ act_bytes, plus the boundary buffers: each received input kept until its
backward (in_flight × m × the previous layer's out_bytes) and one gradient buffer for its output.
In flight: GPipe runs every forward first, so M; 1F1B starts backward once the pipeline is full,
so PP − p (≤ M); Interleaved1F1B warms up 2(PP − p − 1) + (v − 1)·PP + 1 virtual-stage
micro-batches (Megatron-LM's count, ≤ v·M), each counted at the rank's largest stage.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate

from ftrun.inflight import in_flight as shared_in_flight
from ftrun.planner.layout import INTERLEAVED, step_total
from ftrun.planner.profile import LayerProfile, Links, Profile
from ftrun.planner.split import Stages


@dataclass(frozen=True, kw_only=True)
class StepCost:
    compute_s: float
    bubble_s: float
    allreduce_s: float
    p2p_s: float
    reduce_s: float
    optimizer_s: float
    loss_s: float

    @property
    def step_s(self) -> float:
        return step_total(self)


def stage_time(profile: Profile, start: int, end: int, m: int) -> float:
    """Forward + backward of one micro-batch of m samples through layers [start, end)."""
    return sum(layer.time_s(m) for layer in profile.layers[start:end])


def allreduce_s(grad_bytes: float, dp: int, links: Links) -> float:
    """A ring all-reduce of `grad_bytes` over dp ranks: 2(dp − 1) steps of 1/dp of the bytes."""
    if dp <= 1:
        return 0.0
    steps = 2 * (dp - 1)
    return steps / dp * grad_bytes / links.allreduce_bytes_per_s + steps * links.allreduce_latency_s


def loss_s(world: int, links: Links) -> float:
    """The loss's all-reduce over all `world` ranks: one number reduced up a binary tree and
    broadcast back down, 2⌈log2 world⌉ latencies (collectives take a tree or halving-doubling
    for a buffer this small: NCCL's tree, gloo's)."""
    return 2 * math.ceil(math.log2(world)) * links.allreduce_latency_s if world > 1 else 0.0


def reduce_s(grad_bytes: float, dp: int, reduce_bytes_per_s: float | None) -> float:
    """A rank's own work in a ring all-reduce of `grad_bytes` over dp ranks: the 2(dp − 1)/dp × G
    bytes a ring moves through it, at the rate its device reduces them (None: not profiled)."""
    if dp <= 1 or not reduce_bytes_per_s:
        return 0.0
    return 2 * (dp - 1) / dp * grad_bytes / reduce_bytes_per_s


def p2p_s(profile: Profile, stages: Stages, m: int) -> float:
    """The fill and drain sends: every stage boundary crossed once each way by one micro-batch."""
    links = profile.links
    boundaries = [end - 1 for _, end in stages[:-1]]
    return 2 * sum(
        m * profile.layers[b].out_bytes / links.p2p_bytes_per_s + links.p2p_latency_s
        for b in boundaries
    )


def rank_stages(stages: Stages, pp: int, position: int) -> Stages:
    """The virtual stages pipeline rank `position` holds: position, position + pp, …"""
    return stages[position::pp]


def per_rank_layers(
    profile: Profile, stages: Stages, pp: int, of: Callable[[LayerProfile], float]
) -> list[float]:
    """`of` summed over the layers of each pipeline rank's stages, by rank."""
    return [
        sum(
            of(layer)
            for start, end in rank_stages(stages, pp, p)
            for layer in profile.layers[start:end]
        )
        for p in range(pp)
    ]


def step_cost(profile: Profile, stages: Stages, *, dp: int, pp: int, m: int, M: int) -> StepCost:
    """The predicted step of dp replicas running `stages` on pp ranks, M micro-batches of m."""
    times = [stage_time(profile, start, end, m) for start, end in stages]
    per_rank = [sum(times[p::pp]) for p in range(pp)]
    grads = per_rank_layers(profile, stages, pp, lambda layer: layer.gradient_bytes)
    opt = per_rank_layers(profile, stages, pp, lambda layer: layer.opt_s)
    return StepCost(
        compute_s=M * max(per_rank),
        bubble_s=(pp - 1) * max(times),
        allreduce_s=allreduce_s(max(grads), dp, profile.links),
        p2p_s=p2p_s(profile, stages, m),
        reduce_s=reduce_s(max(grads), dp, profile.reduce_bytes_per_s),
        optimizer_s=max(opt),
        loss_s=loss_s(dp * pp, profile.links),
    )


def step_lower_bound(profile: Profile, *, dp: int, pp: int, v: int, m: int, M: int) -> float:
    """A step time no split of this layout can beat: the slowest rank holds at least an even
    share of the time, of the gradients and of the optimizer step, and at least the largest
    layer's."""
    layers = profile.layers
    times = [layer.time_s(m) for layer in layers]
    grads = [layer.gradient_bytes for layer in layers]
    opt = [layer.opt_s for layer in layers]
    links = profile.links
    grad = max(sum(grads) // pp, max(grads))
    return (
        M * max(sum(times) / pp, max(times))
        + (pp - 1) * max(sum(times) / (pp * v), max(times))
        + allreduce_s(grad, dp, links)
        + 2 * (pp * v - 1) * links.p2p_latency_s
        + reduce_s(grad, dp, profile.reduce_bytes_per_s)
        + max(sum(opt) / pp, max(opt))
        + loss_s(dp * pp, links)
    )


def in_flight(schedule: str, *, pp: int, position: int, M: int) -> int:
    """Micro-batches (virtual-stage micro-batches for Interleaved1F1B) whose activations
    pipeline rank `position` holds at its peak (ftrun/inflight.py: the ranks count the same)."""
    v = 2 if schedule == INTERLEAVED else 1
    return shared_in_flight(schedule, pp=pp, position=position, micro_batches=M, v=v)


def _held_per_sample(profile: Profile, start: int, end: int) -> int:
    """Bytes a stage keeps per sample of an in-flight micro-batch: activations and its input."""
    layers = profile.layers
    received = layers[start - 1].out_bytes if start > 0 else 0
    return received + sum(layer.act_bytes for layer in layers[start:end])


def _grad_buffer(profile: Profile, end: int, m: int) -> int:
    """The buffer for the gradient of a stage's output (none for the last stage)."""
    return m * profile.layers[end - 1].out_bytes if end < len(profile.layers) else 0


def stage_memory(profile: Profile, start: int, end: int, *, m: int, in_flight: int) -> int:
    """Peak bytes of one virtual stage holding `in_flight` micro-batches of m samples."""
    state = sum(layer.state_bytes for layer in profile.layers[start:end])
    held = in_flight * m * _held_per_sample(profile, start, end)
    return state + held + _grad_buffer(profile, end, m)


class StageMemories:
    """stage_memory in constant time, from prefix sums: the split asks it O(L²) times."""

    def __init__(self, profile: Profile) -> None:
        layers = profile.layers
        self._state = [0, *accumulate(layer.state_bytes for layer in layers)]
        self._act = [0, *accumulate(layer.act_bytes for layer in layers)]
        self._out = [layer.out_bytes for layer in layers]

    def __call__(self, start: int, end: int, *, m: int, in_flight: int) -> int:
        received = self._out[start - 1] if start > 0 else 0
        held = in_flight * m * (received + self._act[end] - self._act[start])
        grad_in = m * self._out[end - 1] if end < len(self._out) else 0
        return self._state[end] - self._state[start] + held + grad_in


def rank_memory(
    profile: Profile, stages: Stages, *, schedule: str, pp: int, position: int, m: int, M: int
) -> int:
    """Peak bytes of pipeline rank `position`: all its stages' state, and its in-flight
    micro-batches counted at its largest stage (exact when it holds one stage)."""
    mine = rank_stages(stages, pp, position)
    flight = in_flight(schedule, pp=pp, position=position, M=M)
    state = sum(layer.state_bytes for s, e in mine for layer in profile.layers[s:e])
    held = flight * m * max(_held_per_sample(profile, s, e) for s, e in mine)
    return state + held + max(_grad_buffer(profile, e, m) for _, e in mine)
