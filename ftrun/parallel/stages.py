"""Cutting a model into the plan's pipeline stages, keeping every fully-qualified name.

A model's top-level children, in order, are its layers (the pipeline units); running them in
order must be the model's forward. A rank keeps only the layers of its stages, under their own
names, so the state_dict of the rank's part has exactly the full model's keys for those layers:
a DCP checkpoint saved under one layout loads under any other (DESIGN.md section 6). This is the
torchtitan way of splitting a model (delete what the stage does not own), not a traced split.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.distributed.pipelining.schedules import _PipelineSchedule
from torch.nn.parallel import DistributedDataParallel

from ftrun.parallel.plan import Plan, PlanError

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Part(nn.Module):
    """Some of a model's layers under their own names; forward runs them in order."""

    def __init__(self, layers: Sequence[tuple[str, nn.Module]]) -> None:
        super().__init__()
        for name, layer in layers:
            self.add_module(name, layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.children():
            x = layer(x)
        return x


def layer_names(model: nn.Module) -> tuple[str, ...]:
    """The model's pipeline units: its top-level children, in order."""
    if model._parameters or model._buffers:  # would belong to no stage
        own = sorted([*model._parameters, *model._buffers])
        raise PlanError(
            f"{type(model).__name__} has parameters or buffers of its own ({', '.join(own)}); "
            "every one must live in a top-level child (a layer)",
            hint="move them into a child module, e.g. an embedding layer",
        )
    names = tuple(name for name, _ in model.named_children())
    if not names:
        raise PlanError(f"{type(model).__name__} has no child modules to use as layers")
    return names


def check_layers(plan: Plan, model: nn.Module) -> None:
    names = layer_names(model)
    if names != plan.layer_names:
        raise PlanError(
            f"the plan's layers {list(plan.layer_names)} are not the model's top-level "
            f"children {list(names)}",
            hint="profile this model (`ftrun profile`) and plan again for it",
        )


def cut(model: nn.Module, plan: Plan, position: int) -> tuple[Part, list[Part]]:
    """(the rank's part: all its layers, one module per virtual stage sharing those layers).
    The optimizer and the checkpoint use the part; the pipeline runs the stage modules."""
    check_layers(plan, model)
    children = dict(model.named_children())
    stages = [
        Part([(name, children[name]) for name in plan.stage_layers(s)])
        for s in plan.virtual_stages(position)
    ]
    if len(stages) == 1:
        return stages[0], stages
    part = Part(
        [(n, children[n]) for s in plan.virtual_stages(position) for n in plan.stage_layers(s)]
    )
    return part, stages


def replicate(module: nn.Module, group: dist.ProcessGroup, device: torch.device) -> nn.Module:
    """PP = 1: the whole model's replicas over the "dp" group; DDP averages their gradients,
    overlapping the all-reduce with the backward pass."""
    return DistributedDataParallel(
        module,
        device_ids=[device] if device.type == "cuda" else None,
        process_group=group,
    )


def average_grads(module: nn.Module, group: dist.ProcessGroup, dp: int) -> None:
    """PP > 1: average a stage's gradients over its replicas, in one flat all-reduce after the
    schedule. Not DDP: pipelining drives DDP's reducer by hand (stage.py,
    backward_maybe_with_nosync), and with torch 2.13 ScheduleGPipe over DDP stages fails at the
    second step (reducer.cpp INTERNAL ASSERT: rebuilt parameter indices twice the parameters);
    1F1B worked. The cost is no overlap of this all-reduce with the last backward."""
    params = list(module.parameters())
    for p in params:
        if p.grad is None:  # a replica whose layer got no gradient still takes part
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch._utils._flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=group)
    flat.div_(dp)
    for g, avg in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
        g.copy_(avg)


def build_schedule(
    plan: Plan,
    position: int,
    modules: Sequence[nn.Module],
    device: torch.device,
    group: dist.ProcessGroup,
    loss_fn: LossFn,
) -> _PipelineSchedule:
    """The plan's schedule over this position's stage(s). The loss is a mean per micro-batch and
    the schedule divides gradients by M (scale_grads), so each replica's gradient is the mean
    over its M x m samples; average_grads then averages the replicas: the global-batch mean."""
    n_stages = len(plan.stages)
    stages = [
        PipelineStage(module, index, n_stages, device, group=group)
        for module, index in zip(modules, plan.virtual_stages(position), strict=True)
    ]
    m = plan.micro_batches
    if plan.schedule == "GPipe":
        return ScheduleGPipe(stages[0], n_microbatches=m, loss_fn=loss_fn)
    if plan.schedule == "1F1B":
        return Schedule1F1B(stages[0], n_microbatches=m, loss_fn=loss_fn)
    return ScheduleInterleaved1F1B(list(stages), n_microbatches=m, loss_fn=loss_fn)
