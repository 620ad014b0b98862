"""A package run with `-m conf_module`: __spec__, __name__ and argv as `python -m` sets them."""

import sys

import torch.distributed as dist
from _conf import maybe_die, say

dist.init_process_group("gloo")
for step in range(5):
    maybe_die(step)
    dist.barrier()
say(
    "name",
    __name__,
    "spec",
    __spec__.name,
    "argv0",
    sys.argv[0].rsplit("/", 2)[-2:],
    "args",
    sys.argv[1:],
)
