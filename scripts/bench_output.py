#!/usr/bin/env python3
"""Does the agent keep up with a rank that writes ~100 MB/s, in bounded memory?

One `ftrun launch` (localhost, one rank, --progress-regex) of a script that writes --rate MB/s
of 100-byte lines for --seconds, with a `step N t=<wall time>` line per MB, then `END t=...`,
then sleeps --hang-s (a hang, unless --hang-s 0). While it runs, the agent process is sampled
every 0.1 s (RSS, CPU). Reported:
  written      MB/s the rank actually wrote (it says so at the end);
  forwarded    MB of its output that reached the controller's copy of the log, and skipped MB
               (the agent's markers; the host's file keeps every byte);
  agent        peak RSS, and CPU used over the run;
  lag          seconds from the rank writing a `step` line to it being in the controller's copy
               of the log (median, max): the agent not falling behind;
  hang         whether the hang after the burst was detected, and how far past its allowance.

    python scripts/bench_output.py [--rate 100] [--seconds 10] [--hang-s 5]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import benchlib
import psutil
from benchlib import Run

ROOT = Path(__file__).resolve().parent.parent
RANK = textwrap.dedent("""
    import sys, time
    rate, seconds, hang = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    out = sys.stdout.buffer
    line = b"x" * 99 + b"\\n"
    mb = 1 << 20
    chunk = line * (mb // len(line))
    start = time.time()
    written = step = 0
    while time.time() - start < seconds:
        step += 1
        out.write(b"step %d t=%.6f\\n" % (step, time.time()) + chunk)
        written += mb
        if rate > 0:  # pace to the rate
            ahead = written / (rate * mb) - (time.time() - start)
            if ahead > 0:
                time.sleep(ahead)
    out.flush()
    took = time.time() - start
    out.write(b"WROTE %d bytes in %.3f s\\n" % (written, took))
    out.write(b"END t=%.6f\\n" % time.time())
    out.flush()
    time.sleep(hang)
""")


class AgentSampler(threading.Thread):
    """Peak RSS and CPU time of the job's agent (found by its environment)."""

    def __init__(self, run_dir: str) -> None:
        super().__init__(daemon=True)
        self.run_dir = run_dir
        self.peak_rss = 0
        self.cpu_s = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        agent = None
        while not self.stop.wait(0.1):
            if agent is None:
                agent = self._find()
                continue
            try:
                self.peak_rss = max(self.peak_rss, agent.memory_info().rss)
                times = agent.cpu_times()
                self.cpu_s = times.user + times.system
            except psutil.Error:
                return

    def _find(self) -> psutil.Process | None:
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if (
                    proc.info["cmdline"][-1:] == ["ftrun.agent"]
                    and proc.environ().get("FTRUN_RUN_DIR") == self.run_dir
                ):
                    return proc
            except (psutil.Error, TypeError):
                continue
        return None


class LogWatcher(threading.Thread):
    """Tails the controller's copy of rank 0's log: how old each `step` line is on arrival."""

    def __init__(self, run_dir: str) -> None:
        super().__init__(daemon=True)
        self.run_dir = Path(run_dir)
        self.lags: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        f = None
        pending = b""
        while not self.stop.wait(0.02):
            if f is None:
                found = list(self.run_dir.glob("*/logs/g1/rank0.log"))
                f = open(found[0], "rb") if found else None
                continue
            data = f.read()
            now = time.time()
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                if m := STEP.match(line):
                    self.lags.append(now - float(m.group(1)))
        if f is not None:
            f.close()


STEP = re.compile(rb"^step \d+ t=([\d.]+)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=100.0, help="MB/s the rank writes (0: flat out)")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--hang-s", type=float, default=5.0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="ftrun-bench-output-") as tmp:
        script = Path(tmp) / "writer.py"
        script.write_text(RANK)
        run_dir = str(Path(tmp) / "runs")
        env = {"FTRUN_RUN_DIR": run_dir, "PYTHONPATH": str(ROOT)}
        sampler, watcher = AgentSampler(run_dir), LogWatcher(run_dir)
        sampler.start()
        watcher.start()
        run = Run(
            [
                sys.executable,
                "-m",
                "ftrun",
                "launch",
                "--progress-regex",
                r"^step (\d+)",
                "--hang-floor",
                "2",
                "--max-restarts",
                "0",
                str(script),
                str(args.rate),
                str(args.seconds),
                str(args.hang_s),
            ],
            env=env,
            log=Path(tmp) / "launch.out",
        )
        try:  # None: still running at the deadline; close() kills its whole tree
            exit_code = run.wait(args.seconds + args.hang_s + 60)
        finally:
            run.close()
        output = run.tail(3000)
        for thread in (sampler, watcher):
            thread.stop.set()
            thread.join(5)
        [job] = list(Path(run_dir).iterdir())
        log = job / "logs" / "g1" / "rank0.log"
        wrote = None
        forwarded = log.stat().st_size if log.exists() else 0
        skipped = 0
        with open(log, "rb") as f:
            for raw in f:
                if raw.startswith(b"[ftrun: skipped "):
                    skipped += int(raw.split()[2])
                elif raw.startswith(b"WROTE "):
                    wrote = raw.decode().split()
        events = [json.loads(line) for line in (job / "events.jsonl").read_text().splitlines()]
        hang = [e for e in events if e["kind"] == "fault_detected"]
    mb = 1 << 20
    lag = benchlib.median(watcher.lags)
    result = {
        "rate_asked_mb_s": args.rate,
        "written_mb_s": round(int(wrote[1]) / mb / float(wrote[4]), 1) if wrote else None,
        "written_mb": round(int(wrote[1]) / mb) if wrote else None,
        "forwarded_mb": round(forwarded / mb, 1),
        "skipped_mb": round(skipped / mb, 1),
        "agent_peak_rss_mb": round(sampler.peak_rss / mb, 1),
        "agent_cpu_s": round(sampler.cpu_s, 2),
        "wall_s": round(run.wall_s, 1),
        "hang_detected": bool(hang) and hang[0]["fault"] == "hang",
        "hang_past_allowance_s": hang[0].get("past_allowance_s") if hang else None,
        "hang_step": hang[0].get("step") if hang else None,
        "step_lines_seen": len(watcher.lags),
        "lag_median_s": None if lag is None else round(lag, 3),
        "lag_max_s": round(max(watcher.lags), 3) if watcher.lags else None,
        "exit_code": exit_code,  # None: the job never ended (killed at the deadline)
    }
    print(benchlib.to_json(result))
    ok = result["hang_detected"] if args.hang_s > 0 else exit_code == 0
    if not ok:
        print(output, file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
