#!/usr/bin/env python3
"""Goodput on availability traces: replayed on real hosts, and simulated at the scale users have.

1. Replay and its simulation. On the namespace testbed (5 hosts), `ftrun replay
   ../shared/traces/small-4.csv --time-scale S` runs recipes/gpt_ddp.py (1 rank a host) through
   the trace twice: run A and run B. The simulator is given the costs measured in run A
   (`ftrun simulate --costs-from A`) and its goodput is compared with what run B measured:
   the simulator is checked on a run it was not calibrated on.
2. Simulation of ../shared/traces/bamboo-g4dn.csv (a real AWS spot trace: 24 nodes at most,
   153 events, 10.8 h) with this machine's measured costs: ftrun against checkpoint-restart
   (torchrun elastic: DP only, restart on every change, restore the last save) and the ideal
   (every host up used at the best plan, switching free). DP-only and planned (the sample
   profile of tests/data, 1 device a host), and the baseline at its Young/Daly-optimal save
   interval and at 10 and 30 minutes, since how often it saves decides most of its loss.

    python scripts/bench_goodput.py [--time-scale 0.2] [--tail 60] [--no-replay] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import benchlib
from benchlib import Column, Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.testbed import SCRIPT, Testbed, unavailable_reason  # noqa: E402

TRACES = ROOT.parent / "shared" / "traces"
PROFILE = ROOT / "tests" / "data" / "profile_gpt_small.json"
RECIPE = str(ROOT / "recipes" / "gpt_ddp.py")


def ftrun(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ftrun", *args], capture_output=True, text=True, timeout=timeout
    )


def simulate(trace: Path, *args: str) -> dict[str, Any]:
    done = ftrun("simulate", str(trace), "--json", *args)
    if done.returncode != 0:
        raise SystemExit(f"ftrun simulate failed: {done.stderr}")
    return json.loads(done.stdout)


def replay(bed: Testbed, run_dir: Path, a: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    env = " ".join(f"{k}={shlex.quote(bed.env[k])}" for k in
                   ("FTRUN_TESTBED_DIR", "FTRUN_TESTBED_SUBNET", "FTRUN_TESTBED_PREFIX"))  # fmt: skip
    action = f"env {env} bash {shlex.quote(str(SCRIPT))} {{}} {{{{host}}}}"
    done = ftrun(
        "replay", str(TRACES / "small-4.csv"), "--time-scale", str(a.time_scale),
        "--tail", str(a.tail), "--run-dir", str(run_dir),
        "--on-remove", action.format("kill"), "--on-add", action.format("start"),
        "--", "--ssh-config", str(bed.ssh_config), "--max-restarts", "100",
        RECIPE, "--steps", "100000000", "--ckpt-dir", str(run_dir / "ckpt"),
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"ftrun replay failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    job = next(p.name for p in run_dir.iterdir() if p.name.startswith("replay-"))
    shown = ftrun("inspect", "--run-dir", str(run_dir), job, "--json")
    return job, json.loads(shown.stdout)["goodput"]


def replays(a: argparse.Namespace) -> list[dict[str, Any]]:
    reason = unavailable_reason()
    if reason:
        print(f"bench_goodput: no replay: {reason}", file=sys.stderr)
        return []
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-goodput-") as tmp_name:
        tmp = Path(tmp_name)
        with Testbed(5, state_dir=tmp / "testbed", subnet=a.subnet, prefix=a.prefix) as bed:
            runs = {}
            for i in range(a.runs):
                name = chr(ord("A") + i)
                (tmp / name).mkdir()
                runs[name] = (tmp / name, *replay(bed, tmp / name, a))
        scale = ("--time-scale", str(a.time_scale), "--tail", str(a.tail))
        run_a, job_a, _ = runs["A"]
        sim = simulate(TRACES / "small-4.csv", *scale, "--costs-from", job_a,
                       "--run-dir", str(run_a))  # fmt: skip
        simulated = sim["strategies"]["ftrun"]["account"]
        for name, (_, job, measured) in runs.items():
            rows.append({
                "run": f"replay {name}" + (" (calibrates)" if name == "A" else ""),
                "measured": measured["goodput"], "simulated": simulated["goodput"],
                "error": simulated["goodput"] / measured["goodput"] - 1,
                "badput_s": measured["badput_s"], "job": job,
            })  # fmt: skip
        others = [r["measured"] for r in rows[1:]]
        if others:
            mean = sum(others) / len(others)
            rows.append({
                "run": f"mean of runs B..{chr(ord('A') + len(rows) - 1)}", "measured": mean,
                "simulated": simulated["goodput"], "error": simulated["goodput"] / mean - 1,
            })  # fmt: skip
        rows.append({"run": "simulated", "badput_s": simulated["badput_s"], "costs": sim["costs"]})
    return rows


def bamboo() -> list[dict[str, Any]]:
    rows = []
    trace = TRACES / "bamboo-g4dn.csv"
    for model, extra in (("DP only", []), ("planned", ["--profile", str(PROFILE)])):
        for every in (None, 600.0, 1800.0):
            interval = [] if every is None else ["--baseline-checkpoint-every", str(every)]
            doc = simulate(trace, *extra, *interval)
            s = doc["strategies"]
            rows.append({
                "model": model,
                "interval": doc["baseline"]["checkpoint_every_s"],
                "ftrun": s["ftrun"]["goodput"],
                "ckpt_restart": s["checkpoint-restart"]["goodput"],
                "ideal": s["ideal"]["goodput"],
                "of_ideal": s["ftrun"]["of_ideal"],
                "vs_ckpt_restart": s["ftrun"]["goodput"] / max(1e-9, s["checkpoint-restart"]["goodput"]),
            })  # fmt: skip
    return rows


def report(result: dict[str, Any]) -> None:
    if result.get("replay"):
        print("\n1. small-4.csv replayed on the testbed vs simulated (costs measured in run A)")
        print(Table([
            Column(key="run", header="run", align="<"),
            Column(key="measured", header="goodput measured", spec=".3f"),
            Column(key="simulated", header="simulated", spec=".3f"),
            Column(key="error", header="error", spec="+.1%"),
        ]).render([r for r in result["replay"] if "measured" in r]))  # fmt: skip
        print("\nbadput by bucket, seconds (each replay, and the simulation)")
        buckets = list(result["replay"][0]["badput_s"])
        print(Table([
            Column(key="run", header="run", align="<"),
            *(Column(key=b, header=b.replace("_", " "), spec=".1f") for b in buckets),
        ]).render([{"run": r["run"], **r["badput_s"]} for r in result["replay"]
                   if "badput_s" in r]))  # fmt: skip
        costs = next(r["costs"] for r in result["replay"] if "costs" in r)
        print("\ncosts measured in run A (ftrun/sim/costs.py's DEFAULT_COSTS are such a run's):")
        print("  " + ", ".join(f"{k}={v:g}" for k, v in costs.items()))
    print("\n2. bamboo-g4dn.csv simulated (this machine's costs)")
    print(Table([
        Column(key="model", header="model", align="<"),
        Column(key="interval", header="ckpt-restart save every s", spec=".0f"),
        Column(key="ftrun", header="ftrun", spec=".3f"),
        Column(key="ckpt_restart", header="ckpt-restart", spec=".3f"),
        Column(key="ideal", header="ideal", spec=".3f"),
        Column(key="of_ideal", header="ftrun/ideal", spec=".2f"),
        Column(key="vs_ckpt_restart", header="ftrun/ckpt-restart", spec=".1f"),
    ]).render(result["bamboo"]))  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--time-scale", type=float, default=0.2)
    p.add_argument("--tail", type=float, default=60.0, help="trace seconds after the last event")
    p.add_argument("--replay", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--runs", type=int, default=3, help="replays: the first calibrates")
    p.add_argument("--prefix", default="ftbg", help="testbed name prefix")
    p.add_argument("--subnet", default="10.213.65.0/24", help="testbed /24")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    a = p.parse_args()
    result = {"replay": replays(a) if a.replay else [], "bamboo": bamboo()}
    if a.json:
        benchlib.write_json(a.json, result)
    report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
