#!/usr/bin/env python3
"""Controller load: N simulated agents heartbeating at 2 Hz against the real ControlServer.

The controller side is ftrun's own ControlServer (authentication, replay checks, heartbeat
bookkeeping and loss detection), in its own process. The agents are asyncio clients speaking the
real protocol, spread over a few driver processes. After a warm-up, each driver silences some of
its agents at random moments (no more heartbeats; the connection stays open, as with a frozen
or partitioned host) and records when; the controller records when it declared each one lost.

    python scripts/bench_controller.py [--sizes 256,1024,4096] [--silence 32] [--modes plain,tls]

Prints, per N and mode: the controller's CPU use (% of one core) in the steady state, and
p50/p99/max of fault → declared lost. Target (DESIGN.md §9): 4096 agents, detection still
≤ 1.5 s. `plain` is the loopback connection of a one-machine job; `tls` the connection agents on
other hosts use (TLS 1.3, ftrun/tls.py): the ratio column is tls over plain.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

import benchlib
import psutil
from benchlib import Column, Table

from ftrun import tls
from ftrun.controller.server import ControlServer
from ftrun.wire import protocol
from ftrun.wire.inbound import AgentLost

HEARTBEAT_S = 0.5  # 2 Hz
LOST_TIMEOUT_S = 1.0  # ftrun's default


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def serve(
    n: int, secret: str, port_q: mp.Queue, lost_q: mp.Queue, stop: mp.Event, use_tls: bool
) -> None:
    raise_fd_limit()

    async def main() -> None:
        server = ControlServer(
            secret,
            expected_agents={f"sim#{i}" for i in range(n)},
            heartbeat_interval_s=HEARTBEAT_S,
            host_lost_timeout_s=LOST_TIMEOUT_S,
        )
        identity = tls.new_identity() if use_tls else None
        with tempfile.TemporaryDirectory() as scratch:
            context = tls.server_context(identity, Path(scratch)) if identity else None
        port = await server.start("127.0.0.1", 0, tls=context)
        port_q.put((port, identity.cert_pem if identity else ""))
        while not stop.is_set():
            try:
                agent_id, msg = await asyncio.wait_for(server.inbox.get(), 0.2)
            except asyncio.TimeoutError:
                continue
            if isinstance(msg, AgentLost):
                lost_q.put((agent_id, time.time()))
        await server.close()

    asyncio.run(main())


def drive(
    ids: list[int],
    port: int,
    secret: str,
    silence: int,
    warmup_s: float,
    window_s: float,
    out_q: mp.Queue,
    cert_pem: str,
) -> None:
    raise_fd_limit()
    rng = random.Random(ids[0])
    silenced = {i: warmup_s + rng.random() * window_s for i in rng.sample(ids, silence)}

    async def agent(i: int, start: float) -> None:
        chan = await protocol.open_channel(
            "127.0.0.1", port, secret, timeout_s=30, cert_pem=cert_pem
        )
        chan.send("hello", agent_id=f"sim#{i}", host=f"sim{i}", pid=os.getpid())

        async def drain_incoming() -> None:
            # Read and discard: the agents' own cost is not what this measures, and verifying
            # every frame here would starve the simulator before it loads the controller.
            try:
                while await chan.reader.read(65536):
                    pass
            except (ConnectionError, OSError):
                return

        reader = asyncio.create_task(drain_incoming())
        await asyncio.sleep(rng.random() * HEARTBEAT_S)  # spread the phases
        silent_at = silenced.get(i)
        last = None
        while True:
            if silent_at is not None and time.monotonic() - start >= silent_at:
                out_q.put((f"sim#{i}", time.time()))
                await asyncio.sleep(LOST_TIMEOUT_S + window_s + warmup_s)  # silent, still connected
                break
            chan.send("heartbeat")
            now = time.monotonic()
            if last is not None and now - start > warmup_s:
                lateness[0] = max(lateness[0], now - last - HEARTBEAT_S)
            last = now
            await asyncio.sleep(HEARTBEAT_S)
        reader.cancel()
        chan.close()

    lateness = [0.0]  # the simulator's own worst heartbeat delay after warm-up

    async def main() -> None:
        start = time.monotonic()
        tasks = []
        for i in ids:
            tasks.append(asyncio.create_task(agent(i, start)))
            if len(tasks) % 64 == 0:
                await asyncio.sleep(0)  # do not flood the listen backlog
        await asyncio.wait(tasks, timeout=warmup_s + 2 * window_s + 10)

    asyncio.run(main())
    out_q.put(("lateness", lateness[0]))


def run_size(
    n: int, drivers: int, silence: int, warmup_s: float, window_s: float, mode: str
) -> dict:
    ctx = mp.get_context("spawn")
    secret = protocol.new_secret()
    port_q, lost_q, fault_q = ctx.Queue(), ctx.Queue(), ctx.Queue()
    stop = ctx.Event()
    server = ctx.Process(target=serve, args=(n, secret, port_q, lost_q, stop, mode == "tls"))
    server.start()
    port, cert_pem = port_q.get(timeout=30)
    ids = list(range(n))
    chunks = [ids[k::drivers] for k in range(drivers)]
    procs = [
        ctx.Process(
            target=drive,
            args=(c, port, secret, silence // drivers, warmup_s, window_s, fault_q, cert_pem),
        )
        for c in chunks
    ]
    for p in procs:
        p.start()
    ctrl = psutil.Process(server.pid)
    time.sleep(warmup_s)  # connecting and settling; measure the steady state after it
    cpu0, t0 = sum(ctrl.cpu_times()[:2]), time.monotonic()
    time.sleep(window_s)
    cpu = (sum(ctrl.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0)
    # Agents that were never silenced but declared lost before the drivers wind down are false
    # alarms; after this moment the drivers close their connections on purpose.
    window_end = time.time() + LOST_TIMEOUT_S
    for p in procs:
        p.join(timeout=warmup_s + 2 * window_s + 30)
    stop.set()
    server.join(timeout=10)
    for p in [*procs, server]:
        if p.is_alive():
            p.kill()
    reports = _drain(fault_q)
    faults = {a: t for a, t in reports if a != "lateness"}
    delays = [t for a, t in reports if a == "lateness"]
    sim_lateness = max(delays) if delays else None
    lost = dict(_drain(lost_q))
    latencies = [lost[a] - t for a, t in faults.items() if a in lost]
    false_alarms = sum(1 for a, t in lost.items() if a not in faults and t <= window_end)
    return {
        "mode": mode,
        "agents": n,
        "controller_cpu_pct": round(100 * cpu, 1),
        "silenced": len(faults),
        "detected": len(latencies),
        "false_alarms": false_alarms,
        "p50_s": benchlib.percentile(latencies, 50),
        "p99_s": benchlib.percentile(latencies, 99),
        "max_s": max(latencies, default=None),
        "simulator_max_heartbeat_delay_s": None if sim_lateness is None else round(sim_lateness, 3),
    }


def _drain(q: mp.Queue) -> list:
    items = []
    while True:
        try:
            items.append(q.get(timeout=0.5))
        except Exception:  # noqa: BLE001 - queue.Empty
            return items


TABLE = Table(
    [
        Column(key="mode", header="mode", align="<"),
        Column(key="agents", header="agents"),
        Column(key="controller_cpu_pct", header="ctrl CPU %", ratio=".2f"),
        Column(key="silenced", header="silenced"),
        Column(key="detected", header="detected"),
        Column(key="false_alarms", header="false"),
        Column(key="p50_s", header="p50 s", spec=".3f"),
        Column(key="p99_s", header="p99 s", spec=".3f", ratio=".2f"),
        Column(key="max_s", header="max s", spec=".3f"),
    ],
    name="mode",
    anchor="plain",
    group="agents",
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="256,1024,4096")
    p.add_argument("--drivers", type=int, default=4)
    p.add_argument("--silence", type=int, default=32, help="agents silenced per size")
    p.add_argument("--warmup-s", type=float, default=8.0)
    p.add_argument("--window-s", type=float, default=10.0)
    p.add_argument("--modes", default="plain,tls", help="plain (loopback), tls (other hosts)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        for mode in args.modes.split(","):
            row = run_size(n, args.drivers, args.silence, args.warmup_s, args.window_s, mode)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    print(TABLE.render(rows))
    if args.json:
        benchlib.write_json(args.json, rows)
    largest = max(r["agents"] for r in rows)
    for big in (r for r in rows if r["agents"] == largest):
        ok = big["p99_s"] is not None and big["p99_s"] <= 1.5 and big["detected"] == big["silenced"]
        print(
            f"\n{big['agents']} agents, {big['mode']}: p99 detection "
            f"{benchlib.cell(big['p99_s'], '.3f')} s ({'meets' if ok else 'misses'} the 1.5 s target)"
        )
    sys.exit(0)


if __name__ == "__main__":
    main()
