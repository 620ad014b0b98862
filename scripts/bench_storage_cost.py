"""What writing to storage costs a training loop on this machine, whoever writes.

    python scripts/bench_storage_cost.py [--rates 100 200 400] [--rounds 6]

A compute loop like a training step (a matmul on the intra-op threads, then a memory-bound
update of 256 MB) runs in windows of --window seconds. Windows alone alternate with windows
beside a writer process: nice 10, pacing its writes of 8 MiB to a rate in MB/s, as ftrun's
persist worker does, but with no ftrun code in it. Its modes:

  direct    O_DIRECT into a file in --dir (the persist worker's way)
  buffered  ordinary writes through the page cache, fsync every GiB
  null      the same writes to /dev/null: the pacing and the wake-ups alone

Reported per mode and rate: the loop's speed beside the writer over its speed alone (the median
of the rounds' ratios, and their min-max). This is what sets ftrun.checkpoint's defaults: the
persist worker writes at most `persist_bandwidth` MB/s, and starts at most every
`persist_interval` seconds (docs/checkpoint.md, "What storage costs").
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import benchlib
import torch
from benchlib import Column, Table

CHUNK = 8 << 20
WRAP = 1 << 30  # the writer rewrites the first GiB of its file

WRITER = r"""
import mmap, os, sys, time
os.nice(10)
rate, mode, path = float(sys.argv[1]), sys.argv[2], sys.argv[3]
buf = mmap.mmap(-1, CHUNK)
buf.write(os.urandom(CHUNK))
if mode == "null":
    fd = os.open("/dev/null", os.O_WRONLY)
else:
    flags = os.O_CREAT | os.O_WRONLY | os.O_TRUNC | (os.O_DIRECT if mode == "direct" else 0)
    fd = os.open(path, flags, 0o600)
t0, sent, pos = time.monotonic(), 0, 0
while True:
    if mode == "null":
        os.write(fd, buf)  # /dev/null takes no offset
    else:
        os.pwrite(fd, buf, pos)
    pos, sent = pos + CHUNK, sent + CHUNK
    if pos >= WRAP:
        pos = 0
        if mode != "null":  # /dev/null refuses fsync
            os.fsync(fd)
    ahead = sent / rate - (time.monotonic() - t0)
    if ahead > 0:
        time.sleep(ahead)  # pacing the writes, as the persist worker's Throttle does
""".replace("CHUNK", str(CHUNK)).replace("WRAP", str(WRAP))


class Loop:
    def __init__(self) -> None:
        self.a, self.b = torch.randn(2048, 2048), torch.randn(2048, 2048)
        self.state = torch.randn(64 << 20)  # 256 MB, updated in place like optimizer state

    def rate(self, seconds: float) -> float:
        """Iterations per second over `seconds`."""
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            self.a @ self.b
            self.state.mul_(1.0000001).add_(0.0)
            n += 1
        return n / (time.perf_counter() - t0)


def beside_writer(loop: Loop, mode: str, rate_mb: float, path: str, window: float) -> float:
    """The loop's rate while a writer runs."""
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(rate_mb * 1e6), mode, path])
    try:
        loop.rate(0.5)  # the writer is started and writing
        rate = loop.rate(window)
        if writer.poll() is not None:
            raise SystemExit(f"the {mode} writer exited ({writer.returncode})")
        return rate
    finally:
        writer.kill()
        writer.wait()


def measure(loop: Loop, mode: str, rate_mb: float, args: argparse.Namespace) -> dict:
    path = os.path.join(args.dir, "bench_storage_cost.data")
    ratios = []
    try:
        for r in range(args.rounds):
            # Which window comes first alternates, so that a drift of the machine's speed
            # (other tenants) does not favour either.
            alone = loop.rate(args.window) if r % 2 == 0 else None
            beside = beside_writer(loop, mode, rate_mb, path, args.window)
            if alone is None:
                alone = loop.rate(args.window)
            ratios.append(beside / alone)
    finally:
        if os.path.exists(path):
            os.unlink(path)
    return {
        "mode": mode,
        "rate": rate_mb,
        "median": statistics.median(ratios),
        "spread": f"{min(ratios):.3f}-{max(ratios):.3f}",
    }


TABLE = Table(
    [
        Column(key="mode", header="writer", align="<"),
        Column(key="rate", header="MB/s", spec=".0f"),
        Column(key="median", header="loop speed vs alone (median)", spec=".3f"),
        Column(key="spread", header="rounds", align="<"),
    ]
)


def main() -> None:
    benchlib.exit_on_sigterm()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", type=float, nargs="+", default=[100, 200, 400], help="MB/s")
    p.add_argument(
        "--modes",
        nargs="+",
        choices=["direct", "buffered", "null"],
        default=["direct", "buffered", "null"],
    )
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--window", type=float, default=5.0, help="seconds per window")
    p.add_argument("--dir", default=tempfile.gettempdir(), help="where the writer's file goes")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    args = p.parse_args()
    loop = Loop()
    loop.rate(2.0)  # warm up
    print(f"{torch.get_num_threads()} threads; {args.rounds} rounds of {args.window} s; {args.dir}")
    t0 = time.monotonic()
    rows = []
    for mode in args.modes:
        # The other modes at the middle rate only: they are there to explain the direct rows.
        for rate in args.rates if mode == "direct" else [statistics.median(args.rates)]:
            rows.append(measure(loop, mode, rate, args))
            print(f"  {rows[-1]}", flush=True)
    print()
    print(TABLE.render(rows))
    print(f"({time.monotonic() - t0:.0f} s)")
    if args.json:
        benchlib.write_json(args.json, {"rows": rows})


if __name__ == "__main__":
    main()
