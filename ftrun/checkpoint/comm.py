"""The few collectives the checkpoint manager needs, on its own gloo group.

A dedicated group keeps checkpoint traffic apart from training collectives (which may be NCCL)
and gives every call a timeout. With one process (or no process group) every call is local.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


class Comm:
    def __init__(self, *, timeout_s: float) -> None:
        if dist.is_available() and dist.is_initialized():
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
        else:
            self.rank, self.world = 0, 1
        self.group: dist.ProcessGroup | None = None
        if self.world > 1:
            self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))

    @property
    def distributed(self) -> bool:
        return self.group is not None

    def all_gather(self, obj: T) -> list[T]:
        if self.group is None:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast(self, obj: T, src: int = 0) -> T:
        if self.group is None:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src, group=self.group)
        return box[0]

    def max_ints(self, values: list[int]) -> list[int]:
        if self.group is None:
            return list(values)
        t = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return [int(v) for v in t.tolist()]

    def barrier(self) -> None:
        if self.group is not None:
            dist.barrier(group=self.group)

    def close(self) -> None:
        if self.group is not None and dist.is_initialized():
            try:
                dist.destroy_process_group(self.group)
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass
            self.group = None
