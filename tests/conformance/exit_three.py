"""Ends with sys.exit(3) on rank 1 after its work; rank 0 exits 0."""

import sys

import torch.distributed as dist
from _conf import maybe_die, say

dist.init_process_group("gloo")
for step in range(5):
    maybe_die(step)
    dist.barrier()
rank = dist.get_rank()
say("exiting with", 3 if rank == 1 else 0)
sys.exit(3 if rank == 1 else 0)
