"""The rank's device and the plan's ("dp", "pp") device mesh.

init_device_mesh lays ranks out row-major, so mesh[d][p] = d * pp + p: the same order the plan's
`mesh` promises (rank = d * pp + p). We check that rather than trust it, because a mismatch would
silently pair the wrong ranks in pipelines and all-reduces. The "pp" sub-mesh's group carries the
pipeline's send/recv, the "dp" sub-mesh's group the gradient all-reduce of each stage's replicas.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ftrun.parallel.plan import Plan, PlanError


def local_device(environ: Mapping[str, str] | None = None) -> torch.device:
    """cuda:LOCAL_RANK when CUDA is available, else the CPU."""
    env = os.environ if environ is None else environ
    if torch.cuda.is_available():
        return torch.device("cuda", int(env.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def init_mesh(plan: Plan, device: torch.device, *, timeout_s: float = 600.0) -> DeviceMesh:
    """Initialise the default process group (NCCL on CUDA, gloo on CPU) if the script has not,
    and build the plan's 2-D mesh over it. Collective; every rank of the plan must call it."""
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo", timeout=timedelta(seconds=timeout_s)
        )
    world = dist.get_world_size()
    if world != plan.world:
        raise PlanError(
            f"the plan is for {plan.dp} x {plan.pp} = {plan.world} ranks, but the world has {world}",
            hint="start as many ranks as the plan's dp x pp",
        )
    mesh = init_device_mesh(device.type, (plan.dp, plan.pp), mesh_dim_names=("dp", "pp"))
    got = mesh.mesh.tolist()
    want = [list(row) for row in plan.mesh]
    assert got == want, f"device mesh {got} is not the plan's {want}"
    return mesh
