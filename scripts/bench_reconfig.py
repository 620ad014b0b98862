#!/usr/bin/env python3
"""Live reconfiguration: ftrun re-plans DP x PP when a host is lost and when it comes back, one run.

On the namespace testbed (scripts/testbed.sh, docs/testbed.md: hosts node1..node4, real sshd and
TCP, one shared filesystem), recipes/gpt_pipeline.py (a GPT of --layers blocks, snapshot every
step) runs under `ftrun launch --profile` on 4 hosts, one rank each, with a per-device memory
budget the whole model does not fit in, so every plan needs pipeline stages. Each host is held
to --cpu-per-host cores by a cgroup quota (scripts/hostcpu.py): a device of a fixed speed, as a
cluster's are, not a share of this machine's cores that falls as ranks are added. The profile
comes from `ftrun profile` on a device like theirs (a cgroup with the same quota), first. Then,
in one job:

  1. the 4-host plan runs --steps-per-phase steps;
  2. node4 is powered off (link down, every process SIGKILLed): the controller detects it,
     re-plans for the 3 hosts left, restores the checkpoint resharded, trains --steps-per-phase;
  3. node4 is powered on: the controller's retries reach it and the planner weighs growing
     back on its calibrated predictions (docs/planner.md, *A planner that learns*): the job
     grows and trains --steps-per-phase, or the grow is declined (journaled with why) and the
     job trains on; then Ctrl-C.

Measured, from the job's journal (`ftrun inspect --json`) and rank 0's per-step lines:
  (a) per plan the controller chose: predicted step time (calibrated with what the job measured
      before it, and the cost model's alone) vs measured (median of rank 0's step times in that
      generation, its first 2 steps left out), and the error; each grow taken or declined, and
      whether a grow's plan then measured slower than the plan it left;
  (b) host lost → first step under the new plan, split into detect / tear down / relaunch /
      first step (the incident's phases);
  (c) throughput kept after losing 1 of 4 hosts: the re-plan's measured samples/s vs the best
      DP-only shrink (PP = 1) that fits the budget on 3 hosts, as the planner finds it: if
      none fits, DP-only trains nothing (0 samples/s). The anchor: shrinking DP is all
      torchrun elastic (and ftrun before the planner) can do. With --dp-only-fits also a
      second job without the budget, where DP-only fits: both measured on 3 hosts;
  (d) steps lost per switch: the steps trained again after each restore.

    python scripts/bench_reconfig.py [--layers 8 --dim 128 --global-batch 32 --budget 24MiB]
                                     [--steps-per-phase 30] [--cpu-per-host 0.4] [--link-check]
                                     [--no-device-only] [--json FILE]

Each host's ranks alone are held to the quota by default (--device-only): a cluster's agent does
not run on the device its ranks train on, and with the whole host held the agent took 0.07-0.14
of its 0.4 core, so the ranks ran on a slower device than the one profiled (docs/planner.md).

Targets (issue 12): (a) error <= 20 %; (b) <= 15 s; (c) >= 1.2x when the model needs PP >= 2;
(d) <= 1 step with a snapshot every step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import benchlib
import hostcpu
from benchlib import Column, Run, Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from ftrun.planner import Profile, rank_layouts  # noqa: E402
from tests.testbed import Testbed, TestbedError, unavailable_reason  # noqa: E402

PY = sys.executable
RECIPE = str(ROOT / "recipes" / "gpt_pipeline.py")
HOSTS = ("node1", "node2", "node3", "node4")
VICTIM = "node4"
STEP_LINE = re.compile(r"step (\d+) loss [\d.]+ \((\d+) ms\)")
LEFT_OUT = 2  # a generation's first steps pay for warm-up
# The testbed's hosts share this machine's cores: one thread per rank (torchrun sets it only
# with more than one rank per host), as one host's own cores would be on a cluster. Without
# it 4 ranks x 2 OpenMP threads spin on 2 cores and every step takes 10-30x longer.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def ftrun(
    *args: str, timeout: float = 300, preexec_fn: Callable[[], None] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "ftrun", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**ONE_THREAD, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "COLUMNS": "160"},
        preexec_fn=preexec_fn,
    )


def take_profile(
    out: Path, args: list[str], a: argparse.Namespace
) -> subprocess.CompletedProcess[str]:
    """`ftrun profile` on a device like the job's: a cgroup held to --cpu-per-host cores with the
    hosts' period, as the profile of a real cluster runs on one of the job's own devices (it
    measures the device's sustained speed, ftrun/parallel/profile.py); its high shares also
    keep other load on this machine from inflating some layers and not others."""
    if not a.cpu_per_host:
        return ftrun("profile", "--out", str(out), RECIPE, *args)
    period_us = int(a.cpu_period_ms * 1000)
    name = f"ftrun-bench-{os.getpid()}-profile"
    with hostcpu.held(name, cpu=a.cpu_per_host, period_us=period_us) as enter:
        return ftrun("profile", "--out", str(out), RECIPE, *args, preexec_fn=enter)


def step_times(log: Path) -> dict[int, float]:
    """step → seconds, from rank 0's `step N loss L (T ms)` lines of one generation."""
    if not log.exists():
        return {}
    return {int(m[1]): int(m[2]) / 1000 for m in STEP_LINE.finditer(log.read_text())}


def events(run_dir: Path, job_id: str) -> list[dict[str, Any]]:
    path = run_dir / job_id / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def gen_steps(evs: list[dict[str, Any]], gen: int) -> int:
    """Progress the journal has seen in generation `gen` (0 before its first step)."""
    steps = [e.get("step") or 0 for e in evs if e.get("gen") == gen and "step" in e]
    return max(steps, default=0)


class Job:
    """One `ftrun launch` on the testbed, waited on through its journal."""

    def __init__(
        self,
        bed: Testbed,
        run_dir: Path,
        model: list[str],
        flags: list[str],
        tick: Callable[[], None] = lambda: None,  # called on every poll (the CPU caps)
    ) -> None:
        self.run_dir = run_dir
        cmd = [
            PY,
            "-m",
            "ftrun",
            "launch",
            "--ssh-config",
            str(bed.ssh_config),
            "--run-dir",
            str(run_dir),
            "--job-name",
            "bench-reconfig",
            "--env",
            "OMP_NUM_THREADS=1",
            *flags,
            RECIPE,
            *model,
            "--steps",
            "1000000",
        ]
        self.command = " ".join(cmd)
        self.run = Run(cmd, env={"PYTHONPATH": str(ROOT)}, cwd=ROOT)
        self.job_id = ""
        self.tick = tick

    def events(self) -> list[dict[str, Any]]:
        if not self.job_id:
            found = [p.name for p in self.run_dir.iterdir() if (p / "events.jsonl").exists()]
            if not found:
                return []
            self.job_id = found[0]
        return events(self.run_dir, self.job_id)

    def wait_steps(self, gen: int, n: int, timeout_s: float) -> None:
        """Until generation `gen` has trained `n` steps past its first."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            evs = self.events()
            first = [e["step"] for e in evs if e["kind"] == "first_step" and e["gen"] == gen]
            log = self.run_dir / self.job_id / "logs" / f"g{gen}" / "rank0.log"
            if first and max(step_times(log), default=0) >= first[0] + n:
                return
            if self.run.proc.poll() is not None:
                raise RuntimeError(f"the job ended: {self.run.tail(2000)}")
            self.tick()
            time.sleep(0.2)
        raise RuntimeError(f"generation {gen} did not train {n} steps in {timeout_s:g} s")

    def grown_or_declined(self, timeout_s: float) -> bool:
        """After a host came back: True once a generation 3 is planned (a grow), False once the
        grow was declined."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            evs = self.events()
            if any(e["kind"] == "plan_chosen" and e["gen"] == 3 for e in evs):
                return True
            if any(e["kind"] == "grow_declined" for e in evs):
                return False
            if self.run.proc.poll() is not None:
                raise RuntimeError(f"the job ended: {self.run.tail(2000)}")
            self.tick()
            time.sleep(0.2)
        raise RuntimeError(f"no grow decided in {timeout_s:g} s")

    def stop(self) -> int | None:
        return self.run.interrupt(60)

    def inspect(self) -> dict[str, Any]:
        out = ftrun("inspect", self.job_id, "--json", "--run-dir", str(self.run_dir))
        return json.loads(out.stdout)


def measured_step_s(run_dir: Path, job_id: str, gen: int) -> float | None:
    times = step_times(run_dir / job_id / "logs" / f"g{gen}" / "rank0.log")
    kept = [t for _, t in sorted(times.items())[LEFT_OUT:]]
    return statistics.median(kept) if kept else None


def dp_only_on(profile: Profile, hosts: int, global_batch: int, budget: int | None) -> Any:
    """The best DP-only (PP = 1) layout on `hosts` one-slot hosts, or None if none fits."""
    layouts = rank_layouts(
        profile, slots=[1] * hosts, global_batch=global_batch, device_memory_bytes=budget
    )
    return next((layout for layout in layouts if layout.pp == 1), None)


def replan_job(
    bed: Testbed, tmp: Path, a: argparse.Namespace, model: list[str], tick: Tick
) -> dict[str, Any]:
    run_dir = tmp / "runs-replan"
    run_dir.mkdir()
    profile = tmp / "profile.json"
    flags = ["--hosts", ",".join(HOSTS), "--min-nodes", "2", "--profile", str(profile)]
    flags += ["--replan-horizon", str(a.horizon_s)]
    flags += ["--link-check"] if a.link_check else []
    job = Job(bed, run_dir, model, flags, tick)
    out: dict[str, Any] = {"command": job.command}
    try:
        job.wait_steps(1, a.steps_per_phase, a.timeout_s)
        out["fault_t"] = time.time()
        bed.kill(VICTIM)
        job.wait_steps(2, a.steps_per_phase, a.timeout_s)
        bed.start(VICTIM)
        tick(now=True)  # its fresh sshd into its cgroup before the controller's retry reaches it
        if job.grown_or_declined(a.timeout_s):
            job.wait_steps(3, a.steps_per_phase, a.timeout_s)
        out["exit_code"] = job.stop()
    finally:
        job.run.close()
    evs = job.events()
    view = job.inspect()
    out["plans"] = [
        {
            "gen": p["gen"],
            "plan": p["summary"],
            "why": p["why"],
            "hosts": len(p["hosts"]),
            "predicted_step_s": p["predicted_step_s"],
            "model_step_s": p.get("model_step_s", p["predicted_step_s"]),
            "calibration": (p.get("calibration") or {}).get("source", "uncalibrated"),
            "measured_step_s": measured_step_s(run_dir, job.job_id, p["gen"]),
            "global_batch": p["layout"]["global_batch"],
        }
        for p in evs
        if p["kind"] == "plan_chosen"
    ]
    for p in out["plans"]:
        if p["measured_step_s"]:
            p["error"] = p["predicted_step_s"] / p["measured_step_s"] - 1
            p["model_error"] = p["model_step_s"] / p["measured_step_s"] - 1
            p["samples_per_s"] = p["global_batch"] / p["measured_step_s"]
    out["calibrated"] = [
        {k: e.get(k) for k in ("gen", "summary", "measured_step_s", "factor", "steps", "final")}
        for e in evs
        if e["kind"] == "plan_calibrated"
    ]
    out["links"] = [p.get("links") for p in evs if p["kind"] == "plan_chosen"][:1]
    out["grows"] = grows(evs, out["plans"])
    [lost] = [i for i in view["incidents"] if i["kind"] == "host-lost"]
    phases = lost["phases"]
    base = out["fault_t"]  # just before the power-off, on the clock every host shares
    out["host_lost"] = {
        "detect_s": phases["detected"] - base,
        "teardown_s": (phases.get("torn down") or phases["detected"]) - phases["detected"],
        "relaunch_s": phases["relaunched"] - (phases.get("torn down") or phases["detected"]),
        "first_step_s": phases["first step again"] - phases["relaunched"],
        "total_s": phases["first step again"] - base,
        "lost_steps": lost["lost_steps"],
    }
    ended = {e["gen"]: e.get("step") for e in evs if e["kind"] == "generation_ended"}
    first = {e["gen"]: e["step"] for e in evs if e["kind"] == "first_step"}
    out["grow_lost_steps"] = (ended.get(2) or 0) - (first[3] - 1) if 3 in first else None
    return out


def grows(evs: list[dict[str, Any]], plans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each grow taken (with whether its plan then measured slower than the plan it left) and
    each declined, with the desk's reason."""
    by_gen = {p["gen"]: p for p in plans}
    out: list[dict[str, Any]] = []
    for p in plans:
        if p["why"].startswith("grow") and p["gen"] - 1 in by_gen:
            before, after = by_gen[p["gen"] - 1]["measured_step_s"], p["measured_step_s"]
            slower = before is not None and after is not None and after > before
            out.append({"taken": True, "gen": p["gen"], "from_s": before, "to_s": after,
                        "slower": slower, "reason": p["why"]})  # fmt: skip
    for e in evs:
        if e["kind"] == "grow_declined":
            out.append({"taken": False, "candidate": e.get("candidate"),
                        "predicted_step_s": e.get("predicted_step_s"), "reason": e["reason"]})  # fmt: skip
    return out


def one_generation(
    bed: Testbed,
    run_dir: Path,
    model: list[str],
    flags: list[str],
    a: argparse.Namespace,
    tick: Callable[[], None],
) -> Job:
    """A job that trains --steps-per-phase steps in its first generation, then is stopped."""
    job = Job(bed, run_dir, model, flags, tick)
    try:
        job.wait_steps(1, a.steps_per_phase, a.timeout_s)
        job.stop()
    finally:
        job.run.close()
    return job


def dp_only_job(
    bed: Testbed,
    tmp: Path,
    a: argparse.Namespace,
    model: list[str],
    tick: Callable[[], None],
    *,
    hosts: int,
    planned: bool,
) -> dict[str, Any]:
    """No budget: the planner's choice on 3 hosts vs plain DP (no --profile) on as many of them
    as keep the global batch, measured."""
    name = "planned" if planned else "dp-only"
    run_dir = tmp / f"runs-{name}"
    run_dir.mkdir()
    flags = ["--hosts", ",".join(HOSTS[:hosts])]
    if planned:
        flags += ["--profile", str(tmp / "profile-unbounded.json")]
        flags += ["--link-check"] if a.link_check else []
    job = one_generation(bed, run_dir, model, flags, a, tick)
    step_s = measured_step_s(run_dir, job.job_id, 1)
    plan = [e["summary"] for e in job.events() if e["kind"] == "plan_chosen"]
    return {
        "name": name,
        "plan": plan[0] if plan else f"DP{hosts} (no plan)",
        "step_s": step_s,
        "samples_per_s": a.global_batch / step_s if step_s else None,
    }


def two_host_job(
    bed: Testbed, tmp: Path, a: argparse.Namespace, model: list[str], tick: Callable[[], None]
) -> dict[str, Any]:
    """The model's accuracy on 2 hosts, 2 ranks."""
    run_dir = tmp / "runs-two-hosts"
    run_dir.mkdir()
    flags = ["--hosts", ",".join(HOSTS[:2]), "--profile", str(tmp / "profile.json")]
    job = one_generation(bed, run_dir, model, flags, a, tick)
    [plan] = [e for e in job.events() if e["kind"] == "plan_chosen"]
    measured = measured_step_s(run_dir, job.job_id, 1)
    return {
        "gen": 1,
        "plan": plan["summary"],
        "hosts": 2,
        "predicted_step_s": plan["predicted_step_s"],
        "measured_step_s": measured,
        "error": plan["predicted_step_s"] / measured - 1 if measured else None,
        "samples_per_s": a.global_batch / measured if measured else None,
        "why": "2 hosts: a core per rank",
    }


class Tick:
    """Called on every poll of a job: moves the hosts' new processes into their cgroups (at
    most once a second; `ip netns pids` is a process of its own)."""

    def __init__(self, caps: hostcpu.HostCpu | None) -> None:
        self.caps = caps
        self.last = 0.0

    def __call__(self, *, now: bool = False) -> None:
        if self.caps is None or (not now and time.monotonic() - self.last < 1.0):
            return
        self.last = time.monotonic()
        try:
            self.caps.confine_all()
        except (TestbedError, OSError, subprocess.SubprocessError) as e:
            print(f"bench_reconfig: confining the hosts: {e}", file=sys.stderr)

    def stats(self) -> dict[str, dict[str, int]]:
        return self.caps.stats() if self.caps else {}


@contextlib.contextmanager
def capped(bed: Testbed, a: argparse.Namespace) -> Iterator[Tick]:
    """Each host at --cpu-per-host cores for as long as the `with` lasts (none with 0)."""
    if not a.cpu_per_host:
        yield Tick(None)
        return
    period_us = int(a.cpu_period_ms * 1000)
    with hostcpu.HostCpu(
        bed, cpu_per_host=a.cpu_per_host, period_us=period_us, device_only=a.device_only
    ) as caps:
        yield Tick(caps)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--budget", default="24MiB", help="memory per device: the model needs PP >= 2")
    p.add_argument("--steps-per-phase", type=int, default=30)
    p.add_argument("--horizon-s", type=float, default=3600.0, help="--replan-horizon")
    p.add_argument("--timeout-s", type=float, default=180.0, help="per phase")
    p.add_argument("--dp-only-fits", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument(
        "--link-check", action="store_true", help="launch with --link-check: measured link figures"
    )
    p.add_argument(
        "--cpu-per-host",
        type=float,
        default=0.4,
        help="cores each testbed host may use (a cgroup CPU quota, scripts/hostcpu.py); 0: the "
        "hosts share the machine's cores, and a rank's share falls as ranks are added",
    )
    p.add_argument("--cpu-period-ms", type=float, default=10.0, help="the quota's CFS period")
    p.add_argument(
        "--device-only",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the quota holds each host's ranks alone; its agent and sshd run beside them "
        "(scripts/hostcpu.py), as on a host whose CPU is not its accelerator (a cluster's agent "
        "does not run on the device); --no-device-only holds the whole host, agent included",
    )
    p.add_argument("--prefix", default="ftbr", help="testbed name prefix")
    p.add_argument("--subnet", default="10.213.62.0/24", help="testbed /24")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    p.add_argument("--report", default=None, help="print the figures of an earlier --json")
    a = p.parse_args()
    if a.report:
        report(json.loads(Path(a.report).read_text()))
        return 0
    reason = unavailable_reason() or (hostcpu.unavailable_reason() if a.cpu_per_host else None)
    if reason:
        print(f"bench_reconfig: {reason}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally below runs
    model = ["--layers", str(a.layers), "--dim", str(a.dim), "--global-batch", str(a.global_batch)]
    budgeted = [*model, "--memory-budget", a.budget]
    result: dict[str, Any] = {"model": model, "budget": a.budget}
    with tempfile.TemporaryDirectory(prefix="bench-reconfig-") as tmp_name:
        tmp = Path(tmp_name)
        made = take_profile(tmp / "profile.json", budgeted, a)
        if made.returncode != 0:
            print(made.stdout + made.stderr, file=sys.stderr)
            return 1
        profile = Profile.from_dict(json.loads((tmp / "profile.json").read_text()))
        fits = dp_only_on(profile, 3, a.global_batch, profile.device_memory_bytes)
        with (
            Testbed(4, state_dir=tmp / "testbed", subnet=a.subnet, prefix=a.prefix) as bed,
            capped(bed, a) as tick,
        ):
            result["replan"] = replan_job(bed, tmp, a, budgeted, tick)
            result["two_hosts"] = two_host_job(bed, tmp, a, budgeted, tick)
            if a.dp_only_fits:
                unbounded = tmp / "profile-unbounded.json"
                take_profile(unbounded, model, a)
                plain = dp_only_on(
                    Profile.from_dict(json.loads(unbounded.read_text())), 3, a.global_batch, None
                )
                result["unbounded"] = [
                    dp_only_job(bed, tmp, a, model, tick, hosts=3, planned=True),
                    dp_only_job(bed, tmp, a, model, tick, hosts=plain.dp, planned=False),
                ]
            result["cpu"] = {
                "cpu_per_host": a.cpu_per_host,
                "device_only": a.device_only,
                "hosts": tick.stats(),
            }
    result["dp_only_fits_budget"] = None if fits is None else fits.name
    if a.json:
        benchlib.write_json(a.json, result)
    report(result)
    return 0


def report(result: dict[str, Any]) -> None:
    r = result["replan"]
    print(f"\nmodel: {' '.join(result['model'])}, {result['budget']} per device, 1 rank per host")
    cpu = result.get("cpu") or {}
    if cpu.get("cpu_per_host"):
        held = "each host's ranks" if cpu.get("device_only") else "each host"
        print(f"{held} capped at {cpu['cpu_per_host']:g} cores (a cgroup quota); per host, the")
        print("quota periods throttled / all, and the processes moved into the cgroup:")
        for host, st in cpu["hosts"].items():
            print(f"    {host}: {st.get('nr_throttled', 0)} / {st.get('nr_periods', 0)}, "
                  f"{st.get('throttled_time', 0) / 1e9:.1f} s throttled, moved {st['moved']}")  # fmt: skip
    else:
        print("the hosts share this machine's cores (no --cpu-per-host): a rank's share of a core")
        print("falls as ranks are added, which the cost model does not know")
    print("\n(a) every plan the controller chose: predicted vs measured step time")
    table = Table(
        [
            Column(key="gen", header="gen"),
            Column(key="plan", header="plan", align="<"),
            Column(key="hosts", header="hosts"),
            Column(key="predicted_step_s", header="predicted s", spec=".3f"),
            Column(key="model_step_s", header="model s", spec=".3f"),
            Column(key="measured_step_s", header="measured s", spec=".3f"),
            Column(key="error", header="error", spec="+.0%"),
            Column(key="model_error", header="model err", spec="+.0%"),
            Column(key="calibration", header="calibrated", align="<"),
            Column(key="samples_per_s", header="samples/s", spec=".0f"),
            Column(key="why", header="why", align="<"),
        ]
    )
    print(table.render(r["plans"]))
    if "two_hosts" in result:
        print("    the same model on 2 hosts:")
        print("    " + table.render([result["two_hosts"]]).replace("\n", "\n    "))
    for c in r.get("calibrated", []):
        print(f"    plan_calibrated gen {c['gen']} {c['summary']}: {c['measured_step_s']:.3f} s "
              f"measured over {c['steps']} steps, factor {c['factor']:.2f}"
              f"{' (final)' if c['final'] else ''}")  # fmt: skip
    for g in r.get("grows", []):
        if g["taken"]:
            verdict = "measured SLOWER" if g["slower"] else "measured faster"
            print(f"    grow taken (gen {g['gen']}): {g['from_s']} s -> {g['to_s']} s, {verdict}")
        else:
            print(f"    grow declined: {g['reason']}")
    if r.get("links"):
        print(f"    links: {r['links'][0]}")
    h = r["host_lost"]
    print(
        f"\n(b) host lost → first step under the new plan: {h['total_s']:.2f} s "
        f"(detect {h['detect_s']:.2f}, tear down {h['teardown_s']:.2f}, relaunch "
        f"{h['relaunch_s']:.2f}, first step {h['first_step_s']:.2f}); target <= 15 s"
    )
    before, after = r["plans"][0], r["plans"][1]
    kept = after.get("samples_per_s") or 0.0
    print("\n(c) throughput after losing 1 of 4 hosts")
    print(f"    re-plan {after['plan']}: {kept:.0f} samples/s measured")
    if before.get("samples_per_s"):
        print(f"    (the 4-host plan before: {before['samples_per_s']:.0f} samples/s)")
    if result["dp_only_fits_budget"] is None:
        print("    best DP-only shrink on 3 hosts: none fits the budget → 0 samples/s; ratio: inf")
    else:
        print(f"    best DP-only shrink that fits the budget: {result['dp_only_fits_budget']}")
    for row in result.get("unbounded", []):
        print(
            f"    no budget, 3 hosts, {row['name']}: {row['plan']}: {row['samples_per_s']:.0f} samples/s"
        )
    if len(result.get("unbounded", [])) == 2:
        planned, plain = result["unbounded"]
        ratio = benchlib.ratio(planned["samples_per_s"], plain["samples_per_s"])
        print(f"    planned / DP-only, both fitting: {ratio:.2f}x")
    grow = r.get("grow_lost_steps")
    print(
        f"\n(d) steps lost: host lost {h['lost_steps']}, grow back "
        f"{'- (no grow)' if grow is None else grow} (snapshot every step; target <= 1)"
    )


if __name__ == "__main__":
    sys.exit(main())
