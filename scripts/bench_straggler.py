#!/usr/bin/env python3
"""One slow host of four: plain torchrun, ftrun detect-only, and ftrun replacing it, one run.

On the namespace testbed (5 hosts, real sshd and TCP), tests/bin/train_toy.py (DDP on gloo, one
rank per host, --width 2048: each step a few tens of ms of compute) runs on node1..node4. Once
a rank has printed step --slow-at, node3's rank is held back half the time (SIGSTOP/SIGCONT in
30 ms turns: a host throttled to half speed) until the run ends. Measured from the ranks'
`STEP n t=<wall time>` lines (the hosts share the machine's clock):

  healthy_steps_per_s  steps --slow-at - 30 .. --slow-at
  after_steps_per_s    the last --tail-steps steps of the run (for ftrun-replace: of the
                       generation that replaced node3)
  detected_after_steps the journal's `straggler` step for node3 - --slow-at (ftrun only);
                       any other host named is listed in wrong_verdicts

Modes: `torchrun` (the anchor: `torch.distributed.run --nnodes 4 --rdzv-backend c10d` on each
host over ssh; it has no notion of a straggler), `ftrun-detect` (`--stragglers report`, the
default: named, not acted on) and `ftrun-replace` (`--stragglers replace --spares node5`).
Each run lasts --steps steps (torch.save every 5 steps to a shared directory, so the replacing
generation resumes), then the hosts are cleaned; the testbed is always torn down. A fourth mode,
`ftrun-preflight`, holds nobody back: node3's link is shaped to 100 Mbit/s (tests/linkshaper.py;
tc's netem is not in every kernel) and a short job runs with `--link-check`: the check before the
first step must leave node3 out (its figures and seconds are the journal's `link_check`).
A fifth, `ftrun-busy` (not in the default --only: it lasts --minutes, 10 by default), slows
nobody: a 4-host job runs beside `stress-ng --cpu 2` (started here, stopped in `finally`, and
given a timeout of its own) and is stopped with Ctrl-C; every `straggler` is a false verdict.

    python scripts/bench_straggler.py [--steps 400] [--slow-at 50] [--json FILE]
    python scripts/bench_straggler.py --only ftrun-busy --minutes 10 --json FILE

Each ftrun result carries `pace_ratios`: the journal's `pace` rounds as [step, ratio] (the slowed
host's figure over the median; for ftrun-busy, each round's largest), the evidence the verdicts
stood on. Quiet rounds are journaled one in 5, every round of a streak at >= 1.3 x is.

The JSON's `summary`: detected_after_steps (ftrun-detect), throughput_after_ratio
(ftrun-replace's after / healthy), torchrun_after_ratio and detect_after_ratio (for contrast),
preflight_found_bad_link (ftrun-preflight: whether the link check left the shaped host out,
and nobody else), preflight_check_s (how long the check took), and false_verdicts and
busy_minutes (ftrun-busy).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
from benchlib import Run

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.linkshaper import slow_link  # noqa: E402
from tests.slowdown import hold_back  # noqa: E402
from tests.testbed import Testbed, unavailable_reason  # noqa: E402

SCRIPT = str(ROOT / "tests" / "bin" / "train_toy.py")
PY = sys.executable
HOSTS = ("node1", "node2", "node3", "node4")
SLOW = "node3"
STEP = re.compile(r"^(?:\[rank(\d+)\]:\s*)?STEP (\d+) t=([\d.]+)")


def steps_of(lines: list[str], rank: str = "0") -> list[tuple[int, float]]:
    out = []
    for line in lines:
        m = STEP.search(line)
        if m and (m.group(1) in (None, rank)):
            out.append((int(m.group(2)), float(m.group(3))))
    return out


def journal_events(run_dir: Path) -> list[dict[str, Any]]:
    return [
        json.loads(x)
        for job in run_dir.iterdir()
        if (job / "events.jsonl").exists()
        for x in (job / "events.jsonl").read_text().splitlines()
        if x
    ]


def ratios(events: list[dict[str, Any]], host: str | None) -> list[list[float]]:
    """Each `pace` round: [step, the host's figure / the median of all] (host None: the
    largest such ratio of the round), the evidence the verdicts were given on."""
    out = []
    for e in events:
        if e["kind"] == "pace" and e["compute_s"]:
            figures = e["compute_s"]
            median = statistics.median(figures.values())
            value = figures.get(host) if host else max(figures.values())
            if median > 0 and value is not None:  # (a generation without the host: none)
                out.append([e["step"], round(value / median, 3)])
    return out


def rate(steps: list[tuple[int, float]]) -> float | None:
    if len(steps) < 2 or steps[-1][1] <= steps[0][1]:
        return None
    return (steps[-1][0] - steps[0][0]) / (steps[-1][1] - steps[0][1])


class Bench:
    def __init__(self, bed: Testbed, tmp: Path, args: argparse.Namespace) -> None:
        self.bed, self.tmp, self.args = bed, tmp, args

    def rank_pid(self, host: str) -> int | None:
        """The training process on `host` (train_toy.py, not a launcher or a shim)."""
        for pid in self.bed.pids(host):
            try:
                p = psutil.Process(pid)
                cmd = " ".join(p.cmdline())
            except psutil.Error:
                continue
            if "train_toy" in cmd and "distributed.run" not in cmd and "rank_shim" not in cmd:
                if p.name() != "sshd":
                    return pid
        return None

    def clean(self) -> None:
        for host in self.bed.hosts:
            sshd = self.bed.state_dir / host.name / "sshd.pid"
            try:
                daemon = int(sshd.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                daemon = -1
            for pid in self.bed.pids(host):
                if pid != daemon:
                    try:
                        psutil.Process(pid).kill()
                    except psutil.Error:
                        pass

    def slow_down(self, lines: list[str], stop: threading.Event) -> dict[str, Any]:
        a = self.args
        deadline = time.monotonic() + a.start_timeout_s
        while time.monotonic() < deadline and not any(s >= a.slow_at for s, _ in steps_of(lines)):
            time.sleep(0.05)
        pid = self.rank_pid(SLOW)
        if pid is None:
            return {"error": f"no rank on {SLOW} at step {a.slow_at}"}
        threading.Thread(target=hold_back, args=(pid, stop), daemon=True).start()
        return {"slowed_pid": pid, "slowed_t": time.time()}

    def measure(self, mode: str, lines: list[str], run_dir: Path | None) -> dict[str, Any]:
        a = self.args
        steps = steps_of(lines)
        healthy = [(s, t) for s, t in steps if a.slow_at - 30 <= s <= a.slow_at]
        out: dict[str, Any] = {"mode": mode, "healthy_steps_per_s": rate(healthy)}
        events = journal_events(run_dir) if run_dir is not None else []
        out["pace_ratios"] = ratios(events, SLOW)
        named = [e for e in events if e["kind"] == "straggler" and e["unit"] == SLOW]
        out["straggler"] = named[0] if named else None
        out["detected_after_steps"] = named[0]["step"] - a.slow_at if named else None
        # Any other host named is a wrong verdict (e.g. rank 0, which alone writes the
        # checkpoint every 5 steps, when a loaded machine makes that 1.3 x a step).
        out["wrong_verdicts"] = [
            {k: e[k] for k in ("unit", "step", "ratio", "rounds")}
            for e in events
            if e["kind"] == "straggler" and e["unit"] != SLOW
        ]
        launched = [e["t"] for e in events if e["kind"] == "generation_launched"]
        tail = steps[-a.tail_steps :]
        if mode == "ftrun-replace" and len(launched) > 1:
            tail = [(s, t) for s, t in steps if t > launched[-1]][-a.tail_steps :]
            out["replaced_by"] = [e["hosts"] for e in events if e["kind"] == "generation_launched"][
                -1
            ]
        out["after_steps_per_s"] = rate(tail)
        h, after = out["healthy_steps_per_s"], out["after_steps_per_s"]
        out["after_ratio"] = after / h if h and after else None
        return out

    def torchrun(self) -> dict[str, Any]:
        a = self.args
        work = self.tmp / "torchrun"
        (work / "ckpt").mkdir(parents=True)
        endpoint = f"{self.bed.host('node1').address}:{a.port}"
        remote = (
            f"cd {shlex.quote(str(ROOT))} && PYTHONPATH={shlex.quote(str(ROOT))} exec "
            + shlex.join([PY, "-m", "torch.distributed.run", "--nnodes", "4",
                          "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                          endpoint, "--rdzv-id", uuid.uuid4().hex, "--log-dir",
                          str(work / "torchelastic"), SCRIPT, "--steps", str(a.steps),
                          "--width", "2048", "--ckpt-dir", str(work / "ckpt")])
        )  # fmt: skip
        runs = {h: Run(self.bed.ssh_argv(h, remote), cwd=ROOT) for h in HOSTS}
        stop = threading.Event()
        try:
            slowed = self.slow_down(runs["node1"].lines, stop)
            runs["node1"].wait(a.run_timeout_s)
            return {**self.measure("torchrun", runs["node1"].lines, None), **slowed}
        finally:
            stop.set()
            for r in runs.values():
                r.close()
            self.clean()

    def ftrun(self, mode: str) -> dict[str, Any]:
        a = self.args
        work = self.tmp / mode
        run_dir = work / "runs"
        (work / "ckpt").mkdir(parents=True)
        run_dir.mkdir()
        policy = ["--stragglers", "replace", "--spares", "node5"] if mode == "ftrun-replace" else []
        cmd = [PY, "-m", "ftrun", "launch", "--ssh-config", str(self.bed.ssh_config),
               "--hosts", ",".join(HOSTS), *policy, SCRIPT, "--steps", str(a.steps),
               "--width", "2048", "--ckpt-dir", str(work / "ckpt")]  # fmt: skip
        env = {"FTRUN_RUN_DIR": str(run_dir), "FTRUN_QUARANTINE_FILE": str(work / "q.json")}
        run = Run(cmd, env=env, cwd=ROOT)
        stop = threading.Event()
        try:
            slowed = self.slow_down(run.lines, stop)
            rc = run.wait(a.run_timeout_s)
            return {**self.measure(mode, run.lines, run_dir), **slowed, "rc": rc}
        finally:
            stop.set()
            run.close()
            self.clean()

    def busy(self) -> dict[str, Any]:
        """No host slowed, for --minutes, beside `stress-ng --cpu 2` (every rank slowed alike,
        and unevenly from moment to moment): every `straggler` named is a false verdict."""
        a = self.args
        run_dir = self.tmp / "ftrun-busy" / "runs"
        run_dir.mkdir(parents=True)
        cmd = [PY, "-m", "ftrun", "launch", "--ssh-config", str(self.bed.ssh_config),
               "--hosts", ",".join(HOSTS), SCRIPT, "--steps", str(10**9), "--width", "2048",
               "--ckpt-dir", str(run_dir.parent)]  # fmt: skip
        env = {"FTRUN_RUN_DIR": str(run_dir), "FTRUN_QUARANTINE_FILE": str(run_dir / "q.json")}
        # stress-ng's own timeout ends it even if this script is killed before `finally`.
        stress = Run(["stress-ng", "--cpu", "2", "--timeout", f"{int(a.minutes * 60) + 300}s"])
        try:
            run = Run(cmd, env=env, cwd=ROOT)
            try:
                first = run.wait_for(STEP, a.start_timeout_s)
                t0 = time.monotonic()
                rc = run.wait(a.minutes * 60) if first else run.wait(0)  # must not end by itself
                ran_s = time.monotonic() - t0
                if rc is None:
                    rc = run.interrupt(60)  # Ctrl-C: 130
            finally:
                run.close()
        finally:
            stress.close()
            self.clean()
        events = journal_events(run_dir)
        named = [e for e in events if e["kind"] == "straggler"]
        rounds = ratios(events, None)
        worst = sorted(r for _, r in rounds)
        return {
            "mode": "ftrun-busy",
            "rc": rc,
            "minutes": round(ran_s / 60, 2) if first else 0.0,
            "steps": max((s for s, _ in steps_of(run.lines)), default=0),
            "pace_rounds": len(worst),
            # Each round's largest figure / the median: how close noise came to RATIO.
            "worst_ratio_p50": worst[len(worst) // 2] if worst else None,
            "worst_ratio_p99": worst[int(len(worst) * 0.99)] if worst else None,
            "worst_ratio_max": worst[-1] if worst else None,
            "false_verdicts": len(named),
            "stragglers": named,
            "pace_ratios": rounds,
            **({} if first else {"tail": run.lines[-10:]}),
        }

    def preflight(self) -> dict[str, Any]:
        """node3's link at 100 Mbit/s, a short job with --link-check: is node3 left out?"""
        a = self.args
        run_dir = self.tmp / "ftrun-preflight" / "runs"
        run_dir.mkdir(parents=True)
        cmd = [PY, "-m", "ftrun", "launch", "--ssh-config", str(self.bed.ssh_config),
               "--hosts", ",".join(HOSTS), "--link-check", SCRIPT, "--steps", "3"]  # fmt: skip
        env = {"FTRUN_RUN_DIR": str(run_dir), "FTRUN_QUARANTINE_FILE": str(run_dir / "q.json")}
        try:
            with slow_link(self.bed.host(SLOW).namespace):
                run = Run(cmd, env=env, cwd=ROOT)
                try:
                    rc = run.wait(a.run_timeout_s)
                finally:
                    run.close()
                    tail = run.lines[-5:]
        finally:
            self.clean()
        events = journal_events(run_dir)
        checks = [e for e in events if e["kind"] == "link_check"]
        left = [e["host"] for e in events if e["kind"] == "host_left_out"]
        check = checks[0] if checks else {}
        return {
            "mode": "ftrun-preflight",
            "rc": rc,
            "found": left == [SLOW] and list(check.get("bad_hosts", {})) == [SLOW],
            "left_out": left,
            "check_s": check.get("seconds"),
            "link_check": check or None,
            **({} if rc == 0 else {"tail": tail}),
        }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--slow-at", type=int, default=50)
    p.add_argument("--tail-steps", type=int, default=40)
    p.add_argument("--minutes", type=float, default=10.0, help="ftrun-busy's length")
    p.add_argument("--only", default="torchrun,ftrun-detect,ftrun-replace,ftrun-preflight")
    p.add_argument("--port", type=int, default=29731)
    p.add_argument("--start-timeout-s", type=float, default=120)
    p.add_argument("--run-timeout-s", type=float, default=600)
    p.add_argument("--prefix", default="ftbs")
    p.add_argument("--subnet", default="10.213.53.0/24")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    if (why := unavailable_reason()) is not None:
        print(f"bench_straggler: no testbed here: {why}", file=sys.stderr)
        return 2
    results = []
    with tempfile.TemporaryDirectory(prefix="ftrun-bench-straggler-") as tmp_name:
        tmp = Path(tmp_name)
        with Testbed(5, state_dir=tmp / "testbed", subnet=args.subnet, prefix=args.prefix) as bed:
            bench = Bench(bed, tmp, args)
            for mode in args.only.split(","):
                if mode == "torchrun":
                    r = bench.torchrun()
                elif mode == "ftrun-preflight":
                    r = bench.preflight()
                elif mode == "ftrun-busy":
                    r = bench.busy()
                else:
                    r = bench.ftrun(mode)
                results.append(r)
                hidden = ("straggler", "stragglers", "link_check", "pace_ratios")
                shown = {k: v for k, v in r.items() if k not in hidden}
                print(json.dumps(shown), flush=True)
    by = {r["mode"]: r for r in results}
    summary = {
        "detected_after_steps": by.get("ftrun-detect", {}).get("detected_after_steps"),
        "throughput_after_ratio": by.get("ftrun-replace", {}).get("after_ratio"),
        "detect_after_ratio": by.get("ftrun-detect", {}).get("after_ratio"),
        "wrong_verdicts": sum(
            len(by.get(m, {}).get("wrong_verdicts", [])) for m in ("ftrun-detect", "ftrun-replace")
        ),
        "torchrun_after_ratio": by.get("torchrun", {}).get("after_ratio"),
        "preflight_found_bad_link": by.get("ftrun-preflight", {}).get("found"),
        "preflight_check_s": by.get("ftrun-preflight", {}).get("check_s"),
        "false_verdicts": by.get("ftrun-busy", {}).get("false_verdicts"),
        "busy_minutes": by.get("ftrun-busy", {}).get("minutes"),
    }
    print(json.dumps({"summary": summary}, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
