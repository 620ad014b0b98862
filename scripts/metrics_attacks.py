"""Attacks on a job's --metrics-port, as another user runs them (issue 34, item 2): shared by
tests/hostile/live/test_metrics_attacks.py and scripts/bench_hostile.py, and run as a program
so that it can run as `nobody` (setpriv):

    python scripts/metrics_attacks.py slowloris PORT CONNECTIONS SECONDS
        CONNECTIONS connections that each send a request a byte a second and never finish it;
        one closed by the server is opened again. Prints one JSON line: opened, closed_by_server.
    python scripts/metrics_attacks.py scrapes PORT COUNT [THREADS]
        COUNT whole scrapes (GET /metrics) from THREADS threads, as fast as they go. Prints one
        JSON line: ok, failed, seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import socket
import sys
import threading
import time

HOST = "127.0.0.1"


async def slowloris(port: int, connections: int, seconds: float) -> dict[str, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, connections + 64)), hard))
    stats = {"opened": 0, "closed_by_server": 0, "failed": 0}
    deadline = time.monotonic() + seconds

    async def one() -> None:
        while time.monotonic() < deadline:
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), 5)
            except (OSError, asyncio.TimeoutError):
                stats["failed"] += 1
                await asyncio.sleep(0.2)
                continue
            stats["opened"] += 1
            try:
                writer.write(b"GET /metrics HTTP/1.1\r\n")
                for byte in b"X-Slow: " + b"a" * 10_000:
                    if time.monotonic() >= deadline:
                        return
                    writer.write(bytes([byte]))
                    await writer.drain()
                    with contextlib.suppress(asyncio.TimeoutError):
                        if await asyncio.wait_for(reader.read(1), 1.0) == b"":
                            stats["closed_by_server"] += 1
                            break
            except OSError:
                stats["closed_by_server"] += 1
            finally:
                writer.close()

    await asyncio.gather(*(one() for _ in range(connections)))
    return stats


def scrape(port: int, timeout_s: float = 10.0) -> bytes:
    """One whole scrape: the answer's body (raises on a failed one)."""
    with socket.create_connection((HOST, port), timeout=timeout_s) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    data = b"".join(chunks)
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise OSError(f"answer: {head[:40]!r}")
    return body


def scrapes(port: int, count: int, threads: int = 4) -> dict[str, float]:
    stats = {"ok": 0, "failed": 0}
    lock = threading.Lock()
    left = [count]

    def worker() -> None:
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            try:
                scrape(port)
                outcome = "ok"
            except OSError:
                outcome = "failed"
            with lock:
                stats[outcome] += 1

    t0 = time.monotonic()
    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return {**stats, "seconds": round(time.monotonic() - t0, 2)}


def main(argv: list[str]) -> int:
    what, port = argv[0], int(argv[1])
    if what == "slowloris":
        out: dict[str, float] = dict(asyncio.run(slowloris(port, int(argv[2]), float(argv[3]))))
    elif what == "scrapes":
        out = scrapes(port, int(argv[2]), int(argv[3]) if len(argv) > 3 else 4)
    else:
        raise SystemExit(__doc__)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
