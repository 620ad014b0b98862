"""A real gloo process group's workers park once a backward's collectives are done, and the
guarded destroy_process_group (ftrun/agent/gloo_quiesce.py) still destroys it."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from ftrun.agent import gloo_quiesce

pytestmark = pytest.mark.skipif(gloo_quiesce.FUTEX is None, reason="futex number unknown here")

GLOO = """
import os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from ftrun.agent import gloo_quiesce
gloo_quiesce.install()
gloo_quiesce.install()  # twice: wrapped once
assert dist.destroy_process_group.__ftrun_guarded__
assert dist.distributed_c10d.destroy_process_group is dist.destroy_process_group
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0, world_size=1)
model = DDP(torch.nn.Linear(8, 1))
model(torch.randn(4, 8)).sum().backward()
assert gloo_quiesce.wait_parked(limit=10)
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print("workers", names.count(gloo_quiesce.WORKER_NAME))
dist.destroy_process_group()
del model
print("destroyed")
"""


def test_a_real_gloo_groups_workers_park_and_the_guarded_destroy_still_destroys():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = subprocess.run(
        [sys.executable, "-c", GLOO, str(port)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.split("\n")
    assert int(lines[0].split()[1]) >= 1 and lines[1] == "destroyed"
