"""A long job's journal, written fast: what `status`, `status --watch`, `inspect` and the metrics
are measured on (scripts/bench_listing.py) and tested with (tests/hostile/test_listing_bounds.py).

What fills a real journal over days is the controller's steady beat (ftrun/controller/
generation.py, server.py): a `progress` event and a `checkpoint_committed` event about once a
second each, a `heartbeat_stats` event every 10 s with its lateness histograms; and, once in a
while, an incident: fault_detected with a traceback and log tail, fault_classified, torn_down,
restart, the next generation_launched with its rank_started events, checkpoint_restored and
first_step. The events are the controller's own shapes (field names and types of
journal_schema.py), written with `json.dumps` as Journal.record writes them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

T0 = 1_700_000_000.0
HOSTS = ["node1", "node2", "node3", "node4"]
NPROC = 8
INCIDENT_EVERY_S = 3 * 3600  # a fault every three hours of training (Llama 3's rate at scale)
TRACEBACK = "Traceback (most recent call last):\n" + '  File "train.py", line 88, in step\n' * 12


def _line(event: dict[str, Any]) -> bytes:
    return (json.dumps(event, separators=(",", ":")) + "\n").encode()


def _launch(t: float, gen: int) -> list[dict[str, Any]]:
    world = len(HOSTS) * NPROC
    out: list[dict[str, Any]] = [
        {"t": t, "kind": "generation_launched", "gen": gen, "hosts": HOSTS, "world_size": world}
    ]
    for rank in range(world):
        host = HOSTS[rank // NPROC]
        out.append({"t": t + 0.5, "kind": "rank_started", "gen": gen, "host": host,
                    "rank": rank, "pid": 10_000 + gen * 100 + rank})  # fmt: skip
    return out


def write_journal(
    path: Path, size_bytes: int, *, finished: bool = True, incident_every_s: int = INCIDENT_EVERY_S
) -> int:
    """Write about `size_bytes` of a long job's journal to `path`; returns the events written.
    Times are one second apart per beat, from T0; the job ends `succeeded` when `finished`."""
    n = 0
    gen, step, incident = 1, 0, 0
    t = T0
    with open(path, "wb") as f:
        head = [
            {"t": t, "kind": "job_started", "name": "train.py", "hosts": HOSTS, "spares": [],
             "nproc_per_node": NPROC, "controller_pid": 1, "controller_create_time": 1.0, "run": 1},
            *[{"t": t + 0.1, "kind": "agent_connected", "host": h, "agent": f"{h}-a"}
              for h in HOSTS],
            *_launch(t + 0.2, gen),
        ]  # fmt: skip
        written = sum(f.write(_line(e)) for e in head)
        n += len(head)
        t += 5.0
        f.write(_line({"t": t, "kind": "first_step", "gen": gen, "host": HOSTS[0], "rank": 0,
                       "step": step, "rank_t": t}))  # fmt: skip
        while written < size_bytes:
            t += 1.0
            step += 2
            beat = [
                {"t": t, "kind": "progress", "gen": gen, "step": step, "stall_s": 0.012},
                {"t": t + 0.01, "kind": "checkpoint_committed", "gen": gen, "step": step},
            ]
            if int(t - T0) % 10 == 0:
                hist = {str(ms): 40 + ms for ms in range(0, 24, 2)}
                beat.append(
                    {"t": t + 0.02, "kind": "heartbeat_stats", "period_s": 10.0, "agents": 4,
                     "slow": 0, "deferred_checks": 0,
                     "heartbeat_late": {"n": 80, "p50_ms": 3, "p99_ms": 20, "max_ms": 21.4,
                                        "hist": hist},
                     "loop_lag": {"n": 20, "p50_ms": 1, "p99_ms": 4, "max_ms": 4.2,
                                  "hist": {"0": 12, "1": 6, "4": 2}}})  # fmt: skip
            if int(t - T0) % incident_every_s == 0:
                incident += 1
                beat += [
                    {"t": t, "kind": "fault_detected", "incident": incident, "gen": gen,
                     "fault": "crash", "host": HOSTS[1], "rank": 9, "fault_t": t - 0.05,
                     "detected_t": t, "exit_code": 1, "step": step, "exception": "RuntimeError",
                     "traceback": TRACEBACK, "tail": ["loss 1.23"] * 20},
                    {"t": t + 0.01, "kind": "fault_classified", "incident": incident,
                     "tier": "restart_in_place", "decision": "restart", "reason": "a crash"},
                    {"t": t + 0.3, "kind": "generation_ended", "gen": gen, "outcome": "failed",
                     "step": step},
                    {"t": t + 0.3, "kind": "torn_down", "incident": incident, "gen": gen},
                    {"t": t + 0.4, "kind": "restart", "incident": incident, "charged": True},
                ]  # fmt: skip
                gen += 1
                beat += _launch(t + 0.5, gen)
                beat += [
                    {"t": t + 1.5, "kind": "checkpoint_restored", "gen": gen, "step": step,
                     "tier": "memory", "restore_s": 0.4},
                    {"t": t + 2.0, "kind": "first_step", "gen": gen, "host": HOSTS[0],
                     "rank": 0, "step": step + 1, "rank_t": t + 2.0},
                ]  # fmt: skip
                t += 2.0
            for event in beat:
                written += f.write(_line(event))
            n += len(beat)
        if finished:
            t += 1.0
            tail = [
                {"t": t, "kind": "generation_ended", "gen": gen, "outcome": "succeeded",
                 "step": step},
                {"t": t + 0.1, "kind": "job_finished", "state": "succeeded", "exit_code": 0,
                 "reason": "every rank exited 0"},
            ]  # fmt: skip
            for event in tail:
                f.write(_line(event))
            n += len(tail)
    return n
