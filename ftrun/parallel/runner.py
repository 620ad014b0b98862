"""`Parallel`: one optimizer step of the global batch, whatever the DP x PP layout.

A script builds its full model (same seed on every rank), hands it over with its loss and a way
to fetch samples by global index, and calls `step()` once per step. Under FTRUN_PLAN the rank
keeps its stage(s), pipelines micro-batches with torch.distributed.pipelining over the "pp"
group and averages gradients over the "dp" group (with DDP when PP = 1; with one flat
all-reduce after the schedule when PP > 1, because in torch 2.13 GPipe over DDP-wrapped stages
trips DDP's reducer on the second step); without a plan every rank is a full DDP replica (plain
torchrun or python). Either way the gradient is the mean over the global
batch and the returned loss is the global mean, so the training curve does not depend on the
layout, and `module`'s state_dict keys are the full model's, so checkpoints reshard.

    par = Parallel(model, loss_fn=F.cross_entropy, samples=data.get,
                   global_batch=48, micro_batch=4)
    opt = torch.optim.AdamW(par.module.parameters(), lr=1e-3)
    for step in range(start, steps):
        loss = par.step(opt, batch=step)      # global samples [step*48, (step+1)*48)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from ftrun import envcontract
from ftrun.parallel import memory, profile
from ftrun.parallel.mesh import init_mesh, local_device
from ftrun.parallel.plan import Plan, PlanError
from ftrun.parallel.stages import (
    Part,
    average_grads,
    build_schedule,
    check_layers,
    cut,
    layer_names,
    replicate,
)

Samples = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Parallel:
    """The rank's share of a model under a plan, and the step that trains it.

    model: the full model, identical on every rank; its top-level children, in order, are the
      layers and running them in order is its forward. Cut in place: keep no other reference.
    loss_fn(output, target): a mean over the micro-batch (as F.cross_entropy's default).
    samples(start, count): (inputs, targets) of global samples [start, start + count); the same
      index must give the same sample on every rank and in every run.
    plan: explicit, else $FTRUN_PLAN, else DP-only over the world (dp = world, pp = 1).
    memory_budget: bytes per device (or "64MiB"); the rank's stage must fit it, checked here.
    profile_out: explicit, else $FTRUN_PROFILE_OUT: profile the layers, write there, exit 0.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        loss_fn: LossFn,
        samples: Samples,
        global_batch: int,
        micro_batch: int,
        plan: Plan | None = None,
        memory_budget: int | str | None = None,
        profile_out: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        self.loss_fn, self.samples = loss_fn, samples
        self.device = local_device(env)
        budget = None if memory_budget is None else memory.parse_bytes(memory_budget)
        names = layer_names(model)
        profile_out = profile_out or env.get(envcontract.PROFILE_OUT) or None
        if profile_out:
            profile.write_profile(
                profile_out,
                model,
                samples,
                loss_fn,
                micro_batch=micro_batch,
                global_batch=global_batch,
                device_memory_bytes=budget,
                device=self.device,
            )
            print(f"ftrun-parallel: wrote the profile of {len(names)} layers to {profile_out}")
            raise SystemExit(0)

        world = dist.get_world_size() if dist.is_initialized() else int(env.get("WORLD_SIZE", "1"))
        self.plan = (
            plan
            or Plan.from_env(env)
            or Plan.dp_only(world, global_batch, micro_batch, layer_names=names)
        )
        check_layers(self.plan, model)
        if self.plan.global_batch != global_batch:
            raise PlanError(
                f"the plan's global batch is {self.plan.global_batch}, the script's {global_batch}",
                hint="plan for this script's global batch (it is kept constant across layouts)",
            )
        self.mesh = init_mesh(self.plan, self.device) if self.plan.world > 1 else None
        self.rank = dist.get_rank() if self.mesh is not None else 0
        self.replica, self.position = self.plan.coords(self.rank)
        pp = self.plan.pp
        self.is_first, self.is_last = self.position == 0, self.position == pp - 1
        if budget is not None:
            self.memory_need = self._check_budget(model, budget)

        part, stage_modules = cut(model, self.plan, self.position)
        self.module: Part = part.to(self.device)
        """The rank's layers (all its virtual stages), keyed by the full model's names: build the
        optimizer on its parameters and checkpoint it (ftrun.checkpoint.TrainState)."""
        self._replicas: list[nn.Module] = list(stage_modules)
        self._dp_group = self.mesh["dp"].get_group() if self.mesh is not None else None
        if self._dp_group is not None and self.plan.dp > 1 and pp == 1:
            self._replicas = [replicate(stage_modules[0], self._dp_group, self.device)]
        self._schedule = None
        if pp > 1:
            assert self.mesh is not None
            self._schedule = build_schedule(
                self.plan,
                self.position,
                self._replicas,
                self.device,
                self.mesh["pp"].get_group(),
                loss_fn,
            )

    def _check_budget(self, model: nn.Module, budget: int) -> int:
        children = dict(model.named_children())
        figures = profile.measure(
            list(children.values()), self.samples, self.loss_fn, (1, 2), torch.device("cpu"),
            warmup=0, repeats=1, min_timed_s=0.0,
        )  # fmt: skip
        by_name = dict(zip(children, figures, strict=True))
        mine = [
            n for s in self.plan.virtual_stages(self.position) for n in self.plan.stage_layers(s)
        ]
        return memory.check_budget(
            self.plan,
            self.position,
            state_bytes=sum(by_name[n]["state_bytes"] for n in mine),
            act_bytes_per_sample=sum(by_name[n]["act_bytes"] for n in mine),
            budget=budget,
            rank=self.rank,
        )

    def sample_range(self, batch: int) -> range:
        """The global samples this rank's replica trains on in global batch `batch` (0-based)."""
        return self.plan.sample_range(batch, self.replica)

    def step(self, optimizer: torch.optim.Optimizer, *, batch: int) -> float:
        """Zero the gradients, run forward and backward of global batch `batch` (0-based: global
        samples [batch*B, (batch+1)*B)), step the optimizer; the global mean loss, on every rank."""
        optimizer.zero_grad(set_to_none=True)
        inputs = targets = None
        if self.is_first or self.is_last:
            r = self.sample_range(batch)
            inputs, targets = (t.to(self.device) for t in self.samples(r.start, len(r)))
        if self._schedule is None:
            loss = self._accumulate(inputs, targets)
        else:
            loss = self._pipeline(inputs, targets)
            if self._dp_group is not None and self.plan.dp > 1:
                average_grads(self.module, self._dp_group, self.plan.dp)
        optimizer.step()
        return self._global_mean(loss)

    def _accumulate(
        self, inputs: torch.Tensor | None, targets: torch.Tensor | None
    ) -> torch.Tensor:
        """PP = 1: M micro-batches, gradients accumulated (DDP syncs only the last), each loss
        divided by M: the replica's mean gradient; DDP averages the replicas."""
        assert inputs is not None and targets is not None
        (module,) = self._replicas
        n, m = self.plan.micro_batches, self.plan.micro_batch
        total = torch.zeros((), device=self.device)
        for i in range(n):
            defer = isinstance(module, DistributedDataParallel) and i < n - 1
            with module.no_sync() if defer else contextlib.nullcontext():  # type: ignore[operator]
                out = module(inputs[i * m : (i + 1) * m])
                loss = self.loss_fn(out, targets[i * m : (i + 1) * m]) / n
                loss.backward()
            total += loss.detach()
        return total

    def _pipeline(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> torch.Tensor:
        assert self._schedule is not None
        losses: list[torch.Tensor] = []
        if self.is_first:
            self._schedule.step(inputs)
        elif self.is_last:
            self._schedule.step(target=targets, losses=losses, return_outputs=False)
        else:
            self._schedule.step()
        if not self.is_last:
            return torch.zeros((), device=self.device)
        return torch.stack([x.detach() for x in losses]).mean()

    def _global_mean(self, replica_loss: torch.Tensor) -> float:
        """Mean over the replicas of the last stages' losses; other positions add 0."""
        if self.mesh is None:
            return float(replica_loss)
        t = (replica_loss / self.plan.dp if self.is_last else torch.zeros(())).to(
            self.device, torch.float64
        )
        dist.all_reduce(t)
        return float(t)
