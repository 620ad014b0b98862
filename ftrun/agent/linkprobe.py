"""The link check's probe on one host, run as `python linkprobe.py` by the agent (link_probe.py)
with its plan as JSON on stdin; it prints one JSON line of figures per round on stdout.

For each round it is in, the host forms a 2-rank gloo group with that round's peer (a fresh
TCPStore on a port the store's host offered, rank 0 holding it) and measures, after one warm-up
all-reduce that also waits for the peer:

- latency: the shortest of LAT_REPS all-reduces of one float (a round trip each, or nearly);
- bandwidth: BW_BYTES over the best time of up to BW_REPS all-reduces of that many bytes (the
  algorithm bandwidth, as DLRover's bm_allreduce reports it), as many as the round's time
  allows, at least one. The best, not the median, for both: on a busy host the CPU, not the
  link, makes a rep slow now and then, while a link that is slow (a NIC at 100 Mbit/s) is slow
  every time. (The median latency of a healthy pair whose probes were starved of CPU in a loaded
  test run was 12 times the typical pair's, and made a healthy host look bad.)

Gloo over TCP finds its interface by the host's name, as the ranks' torchrun does, so the link
measured is the one the ranks will use. A round that fails (the peer never came, the time ran
out) says why and the next round still runs. Standard library and torch only, no ftrun imports:
it runs as a plain file, like rank_shim.py.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from typing import Any

LAT_REPS = 9
BW_BYTES = 2 << 20  # 2 MiB: a few ms on a healthy link, a fraction of a second on 100 Mbit/s
BW_REPS = 5


def _round(slot: dict[str, Any], deadline: float) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    out: dict[str, Any] = {"round": slot["round"], "peer": slot["peer"]}
    left = max(0.5, deadline - time.monotonic())
    timeout = datetime.timedelta(seconds=left)
    rank = int(slot["rank"])
    store = dist.TCPStore(
        slot["addr"], int(slot["port"]), 2, rank == 0, timeout=timeout, wait_for_workers=False
    )
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timeout)
    try:
        small = torch.zeros(1)
        dist.all_reduce(small)  # the peer is here, the connections are up
        times = []
        for _ in range(LAT_REPS):
            began = time.perf_counter()
            dist.all_reduce(small)
            times.append(time.perf_counter() - began)
        out["latency_s"] = min(times)
        big = torch.zeros(BW_BYTES // 4)
        began = time.perf_counter()
        dist.all_reduce(big)  # warm-up; also how long one takes, to fit the reps in the time
        one = time.perf_counter() - began
        times = []
        # Both ranks must run the same number of reps: decided from rank 0's figure, sent over.
        reps = torch.tensor([max(1, min(BW_REPS, int((deadline - time.monotonic()) / one / 2)))])
        dist.broadcast(reps, 0)
        for _ in range(int(reps.item())):
            began = time.perf_counter()
            dist.all_reduce(big)
            times.append(time.perf_counter() - began)
        out["bandwidth_Bps"] = BW_BYTES / min(times)
    finally:
        dist.destroy_process_group()
    return out


def main() -> int:
    plan = json.loads(sys.stdin.read())
    deadline = time.monotonic() + float(plan["timeout_s"])
    import torch.distributed  # noqa: F401 - the second or so it takes, before the rounds' shares

    slots = plan["slots"]
    for i, slot in enumerate(slots):
        # Each round gets an equal share of what is left, so one that fails leaves time for the
        # others; the last gets all that remains.
        share = (deadline - time.monotonic()) / (len(slots) - i)
        try:
            result = _round(slot, time.monotonic() + share)
        except Exception as e:  # noqa: BLE001 - a failed round is a figure, not a crash
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            result = {"round": slot["round"], "peer": slot["peer"], "error": first[:300]}
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # not torch's interpreter teardown: seconds on a loaded host, for nothing
