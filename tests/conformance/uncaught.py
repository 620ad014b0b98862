"""Raises an uncaught exception on rank 0 after a few steps."""

import torch.distributed as dist
from _conf import maybe_die, say


def check(step: int) -> None:
    if step == 4 and dist.get_rank() == 0:
        raise RuntimeError(f"bad batch at step {step}")


dist.init_process_group("gloo")
for step in range(6):
    maybe_die(step)
    dist.barrier()
    check(step)
say("unreachable on rank 0")
