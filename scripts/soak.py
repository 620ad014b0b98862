#!/usr/bin/env python3
"""Soak: a real multi-host job on the testbed under a fault every --fault-every seconds.

On the namespace testbed (scripts/testbed.sh: real sshd and TCP, each host its own /dev/shm),
`ftrun launch` runs tests/bin/ckpt_train.py (DDP on gloo, ftrun.checkpoint with a snapshot every
step, every source of randomness in the checkpoint) on node1 and node2, with node3 and node4 as
spares. Every --fault-every seconds, once the job has recovered from the previous fault, one of

  rank-crash       `ftrun chaos JOB kill-rank --rank R`
  rank-hang        `ftrun chaos JOB hang-rank --rank R` (SIGSTOP)
  host-loss        `testbed.sh kill HOST` (power off), started again once the job has recovered:
                   the controller's retries bring it back as a spare
  partition        `testbed.sh cut HOST`, healed once the job has recovered
  controller-kill  SIGKILL to the controller, then `ftrun resume JOB` (adopts the running
                   generation within --controller-grace)
  controller-power (only with --faults naming it) the controller's machine loses power: the job
                   is launched from inside testbed host node5 with node4 as `--standby`, and
                   `testbed.sh kill node5` leaves the standby to take the job over and adopt the
                   running generation (docs/standby.md); once, and after it neither controller
                   fault nor a loss of node4 (where the controller now runs) comes again

is injected at random (--seed), or in that order with --cycle. After --minutes no more faults
come and the job trains to its last step. It ends with:

- the job finished, exit 0;
- losses: every (rank, step) the job printed, in every generation, equal to an uninterrupted
  run of the same script on 2 local ranks (plain torchrun), bit for bit, as long as the plan
  did not change (2 hosts throughout: a spare is always back in time); and every step printed
  by some rank, controller faults included (output survives a controller change:
  agent/unacked.py; a (rank, step) line lost with its host is counted, not failed);
- no growth of file descriptors, memory, threads or child processes in the controller and the
  agents: sampled every --sample-every seconds, reported per process (first sample after
  --warmup-s, last, max) with a verdict; and every host back to its sshd alone at the end.

    python scripts/soak.py [--minutes 30] [--fault-every 30] [--seed 1] [--cycle] [--json FILE]

Exit 0 when all three hold, 1 when one does not, 2 when the testbed cannot run here.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchlib
import psutil
from benchlib import Column, Run, Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.testbed import Testbed, unavailable_reason  # noqa: E402

SCRIPT = str(ROOT / "tests" / "bin" / "ckpt_train.py")
PY = sys.executable
FAULTS = ("rank-crash", "rank-hang", "host-loss", "partition", "controller-kill")
ALL_FAULTS = (*FAULTS, "controller-power")
CONTROLLER_HOST, STANDBY = "node5", "node4"  # with controller-power: where each controller runs
# Two ranks: a DDP all-reduce of two is exact whichever rank adds first. With three, the order
# of the additions follows DDP's buckets, which a restarted process builds anew, and the losses
# would differ from the uninterrupted run's in the last bit from the first restart on.
HOSTS, SPARES = ("node1", "node2"), ("node3", "node4")
WORLD = len(HOSTS)
# float.hex(): the losses compare bit for bit. Spelled out because torchrun's merged output
# can run one rank's line into the next ("...p-1LOSS rank=2 ...").
LOSS = re.compile(r"LOSS rank=(\d+) step=(\d+) loss=(-?0x[0-9a-f]\.[0-9a-f]+p[+-]\d+|-?inf|nan)")
RECOVER_TIMEOUT_S = 120.0
# What counts as growth between the first sample after the warm-up and the last.
# A process's children and the hosts' process count follow its role (a spare's agent has its
# warm interpreter; an active one also a generation's torchrun, shims, ranks and persist
# workers): up to one generation's worth of difference is a role, more is a leak.
GROWTH = {"fds": 8, "threads": 4, "children": 8, "rss_mib": 32, "processes": 16}


class Soak:
    def __init__(self, bed: Testbed, tmp: Path, args: argparse.Namespace) -> None:
        self.bed, self.tmp, self.args = bed, tmp, args
        self.run_dir = tmp / "runs"
        self.run_dir.mkdir()
        self.env = {"PYTHONPATH": str(ROOT), "FTRUN_RUN_DIR": str(self.run_dir)}
        self.steps = max(50, int(args.minutes * 60 * 0.75 / args.step_time))
        self.rng = random.Random(args.seed)
        self.controllers: list[Run] = []
        self.job = ""
        self.faults: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.policy = tmp / "policy.toml"
        # A soak fails its hosts on purpose: no quarantine, and no restart budget to run out.
        self.policy.write_text("[quarantine]\nfailures = 100000\nwindow_s = 1\nexpiry_s = 1\n")
        self.faults_asked = tuple(args.faults.split(","))
        self.standby = "controller-power" in self.faults_asked
        self.taken_over = False  # the standby leads: its replica of the job directory is read

    @property
    def job_dir(self) -> Path:
        if self.taken_over:
            return self.run_dir / ".standby" / STANDBY / self.job
        return self.run_dir / self.job

    # -- the job ---------------------------------------------------------------------------

    def launch(self) -> None:
        cmd = [
            PY, "-m", "ftrun", "launch", "--ssh-config", str(self.bed.ssh_config),
            "--hosts", ",".join(HOSTS), "--spares", ",".join(SPARES),
            "--max-restarts", "100000", "--policy", str(self.policy), "--job-name", "soak",
            # controller-kill is a person's `ftrun resume`: no standby to take the job first
            *(["--standby", STANDBY] if self.standby else ["--no-standby"]),
            SCRIPT, "--steps", str(self.steps), "--step-time", str(self.args.step_time),
            "--save-every", "1", "--persist-every", "20", "--ckpt-dir", str(self.tmp / "ckpt"),
        ]  # fmt: skip
        if self.standby:  # typed on node5: the controller runs in its namespace
            cmd = ["ip", "netns", "exec", self.bed.host(CONTROLLER_HOST).namespace, *cmd]
        self.controllers.append(Run(cmd, env=self.env, cwd=ROOT))
        deadline = time.time() + 180
        while time.time() < deadline and not self.events_of("first_step"):
            self.check_controller()
            time.sleep(0.2)
        if not self.events_of("first_step"):
            raise SoakError("the job did not take its first step within 180 s")

    @property
    def controller(self) -> Run:
        return self.controllers[-1]

    def check_controller(self) -> None:
        rc = self.controller.proc.poll()
        if rc is not None:
            raise SoakError(f"the controller exited {rc}: {self.controller.tail(1500)}")

    def events(self) -> list[dict[str, Any]]:
        if not self.job:
            jobs = [p for p in self.run_dir.iterdir() if (p / "events.jsonl").exists()]
            if not jobs:
                return []
            self.job = jobs[0].name
        return events_in(self.job_dir) if (self.job_dir / "events.jsonl").exists() else []

    def events_of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events() if e.get("kind") == kind]

    def generation(self) -> dict[str, Any]:
        return self.events_of("generation_launched")[-1]

    def finished(self) -> bool:
        return bool(self.events_of("job_finished"))

    def ftrun(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv, env = [PY, "-m", "ftrun", *args], {**os.environ, **self.env}
        if self.taken_over:  # the controller runs on the standby host, its directory there
            argv = ["ip", "netns", "exec", self.bed.host(STANDBY).namespace, *argv]
            env["FTRUN_RUN_DIR"] = str(self.job_dir.parent)
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=60, cwd=ROOT, env=env
        )  # fmt: skip

    # -- faults ----------------------------------------------------------------------------

    def inject(self, kind: str) -> dict[str, Any]:
        gen = self.generation()
        fault: dict[str, Any] = {"kind": kind, "t": time.time(), "gen": gen["gen"]}
        if kind in ("rank-crash", "rank-hang"):
            fault["rank"] = self.rng.randrange(gen["world_size"])
            action = "kill-rank" if kind == "rank-crash" else "hang-rank"
            done = self.ftrun("chaos", self.job, action, "--rank", str(fault["rank"]))
            if done.returncode != 0:
                fault["error"] = (done.stderr or done.stdout).strip()[-300:]
                return fault
        elif kind in ("host-loss", "partition"):
            fault["host"] = self.rng.choice([h for h in gen["hosts"] if not self.leads_on(h)])
            (self.bed.kill if kind == "host-loss" else self.bed.cut)(fault["host"])
        elif kind == "controller-power":
            self.bed.kill(CONTROLLER_HOST)
            self.controller.wait(30)
            self.taken_over = True
            self.controllers.append(Takeover(self.bed, self.job_dir))
        else:
            self.controller.proc.kill()  # SIGKILL, the controller alone: agents live on
            self.controller.wait(30)
            self.controllers.append(Run([PY, "-m", "ftrun", "resume", self.job], env=self.env))
        self.wait_recovered(fault)
        if "new_gen" in fault:  # what its ranks restored from, and whether a peer copy helped
            events = self.events()
            for e in events:
                if e["kind"] == "checkpoint_restored" and e["gen"] == fault["new_gen"]:
                    fault["restored"] = f"{e['tier']} step {e['step']}"
                if e["kind"] == "peer_fetched" and e["gen"] == fault["new_gen"]:
                    fault["peer"] = e.get("error") or e["which"]
        if kind in ("host-loss", "partition"):
            self.bring_back(fault)
        fault["recovered_s"] = round(fault.pop("recovered_t") - fault["t"], 3)
        return fault

    def wait_recovered(self, fault: dict[str, Any]) -> None:
        """Training again after the fault: a later generation's first step, or (the controller
        killed) a step journaled by the resumed controller after it adopted or resumed."""
        deadline = fault["t"] + RECOVER_TIMEOUT_S
        while time.time() < deadline:
            self.check_controller()
            events = self.events()
            if fault["kind"] in ("controller-kill", "controller-power"):
                back = [
                    e for e in events
                    if e["kind"] in ("adopted", "resumed") and e["t"] > fault["t"]
                ]  # fmt: skip
                if back:
                    fault["adopted"] = back[-1]["kind"] == "adopted"
                    later = [
                        e for e in events
                        if e["kind"] in ("progress", "first_step") and e["t"] > back[-1]["t"]
                    ]  # fmt: skip
                    if later:
                        fault["recovered_t"] = later[0]["t"]
                        return
            else:
                firsts = [
                    e for e in events if e["kind"] == "first_step" and e["gen"] > fault["gen"]
                ]
                if firsts:
                    fault["recovered_t"] = firsts[0]["t"]
                    fault["new_gen"] = firsts[0]["gen"]
                    return
            if self.finished():
                fault["recovered_t"] = time.time()
                return
            time.sleep(0.2)
        raise SoakError(f"no recovery from {fault} within {RECOVER_TIMEOUT_S:g} s")

    def bring_back(self, fault: dict[str, Any]) -> None:
        """Power the host on (or heal it); the controller's retries make it a spare again."""
        host, since = fault["host"], time.time()
        if fault["kind"] == "host-loss":
            self.bed.start(host)
        else:
            self.bed.heal(host)
        deadline = since + RECOVER_TIMEOUT_S
        while time.time() < deadline:
            self.check_controller()
            if any(e["host"] == host and e["t"] > since for e in self.events_of("agent_connected")):
                fault["back_s"] = round(time.time() - since, 3)
                return
            if self.finished():
                return
            time.sleep(0.2)
        raise SoakError(f"{host} did not rejoin within {RECOVER_TIMEOUT_S:g} s")

    # -- resources -------------------------------------------------------------------------

    def sample(self) -> None:
        t = time.time()
        procs = [("controller", self.controller.proc.pid)]
        for host in self.bed.hosts:
            for pid in self.bed.pids(host):
                try:
                    line = " ".join(psutil.Process(pid).cmdline())
                except psutil.Error:
                    continue
                if "-m ftrun.agent" in line and "zygote" not in line:
                    procs.append((f"agent {host.name}", pid))
        for who, pid in procs:
            try:
                p = psutil.Process(pid)
                with p.oneshot():
                    self.samples.append(
                        {
                            "t": t, "who": who, "pid": pid, "fds": p.num_fds(),
                            "threads": p.num_threads(),
                            "rss_mib": p.memory_info().rss / 2**20,
                            "children": len(p.children(recursive=True)),
                        }
                    )  # fmt: skip
            except psutil.Error:
                continue
        self.samples.append(
            {
                "t": t,
                "who": "all hosts",
                "processes": sum(len(self.bed.pids(h)) for h in self.bed.hosts),
            }
        )

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        a = self.args
        self.launch()
        start = time.time()
        next_fault, next_sample, cycle = start + a.fault_every, start, 0
        while not self.finished():
            self.check_controller_or_done()
            now = time.time()
            if now >= next_sample:
                self.sample()
                next_sample = now + a.sample_every
            if now >= next_fault and now - start < a.minutes * 60:
                kinds = self.faults_now()
                kind = kinds[cycle % len(kinds)] if a.cycle else self.rng.choice(kinds)
                cycle += 1
                fault = self.inject(kind)
                self.faults.append(fault)
                print(f"fault {len(self.faults):3d} {kind:<16} {describe(fault)}", flush=True)
                next_fault = max(time.time(), fault["t"] + a.fault_every)
                continue
            if self.controller.proc.poll() is not None:
                break
            time.sleep(0.2)
        rc = self.controller.wait(a.minutes * 60 + 600)
        self.sample_after()
        return {"rc": rc, "soak_s": round(time.time() - start, 1)}

    def leads_on(self, host: str) -> bool:
        """The host the controller runs on, after a takeover: not a fault's victim."""
        return self.taken_over and host == STANDBY

    def faults_now(self) -> tuple[str, ...]:
        """After the standby took over, its controller is the only one: no controller fault
        again (nothing stands by now), and no loss of its host."""
        if not self.taken_over:
            return self.faults_asked
        gen_hosts = self.generation()["hosts"]
        return tuple(
            k for k in self.faults_asked
            if not k.startswith("controller")
            and not (k in ("host-loss", "partition") and all(map(self.leads_on, gen_hosts)))
        ) or ("rank-crash",)  # fmt: skip

    def check_controller_or_done(self) -> None:
        if self.controller.proc.poll() is not None and not self.finished():
            raise SoakError(f"the controller exited early: {self.controller.tail(1500)}")

    def sample_after(self) -> None:
        """Nothing of the job left on any host (sshd alone) within 20 s."""
        deadline = time.time() + 20
        while time.time() < deadline:
            left = self.leftovers()
            if not left:
                break
            time.sleep(0.2)
        self.left = self.leftovers()

    def leftovers(self) -> dict[str, list[str]]:
        out = {}
        for host in self.bed.hosts:
            names = []
            for pid in self.bed.pids(host):
                try:
                    p = psutil.Process(pid)
                    if p.status() != psutil.STATUS_ZOMBIE and p.name() != "sshd":
                        names.append(f"{pid} {' '.join(p.cmdline())[:100]}")
                except psutil.Error:
                    continue
            if names:
                out[host.name] = names
        return out

    def close(self) -> None:
        for run in self.controllers:
            run.close()


class Takeover:
    """The standby's controller (docs/standby.md): not our child, so watched by its pid on the
    standby host, its exit code read from its journal, its output from its takeover.log."""

    def __init__(self, bed: Testbed, job_dir: Path) -> None:
        self.job_dir = job_dir
        deadline = time.time() + RECOVER_TIMEOUT_S
        found: list[psutil.Process] = []
        while not found and time.time() < deadline:
            for pid in bed.pids(STANDBY):
                try:
                    if "resume" in psutil.Process(pid).cmdline():
                        found.append(psutil.Process(pid))
                except psutil.Error:
                    continue
            time.sleep(0.2)
        if not found:
            raise SoakError(f"no standby controller on {STANDBY} within {RECOVER_TIMEOUT_S:g} s")
        self.process = found[0]
        self.proc = self  # what the soak asks of a Run's Popen: poll, pid, kill

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        if self.process.is_running() and self.process.status() != psutil.STATUS_ZOMBIE:
            return None
        ends = [e for e in events_in(self.job_dir) if e.get("kind") == "job_finished"]
        return int(ends[-1].get("exit_code", 1)) if ends else 1

    def kill(self) -> None:
        self.process.kill()

    def wait(self, timeout_s: float) -> int | None:
        try:
            self.process.wait(timeout_s)
        except psutil.TimeoutExpired:
            return None
        return self.poll()

    def tail(self, chars: int) -> str:
        try:
            return (self.job_dir / "takeover.log").read_text(errors="replace")[-chars:]
        except OSError as e:
            return str(e)

    def close(self) -> None:
        if self.poll() is None:
            self.kill()


def events_in(job_dir: Path) -> list[dict[str, Any]]:
    """The job's journal; a line being written is skipped."""
    out = []
    for line in (job_dir / "events.jsonl").read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


class SoakError(Exception):
    pass


def describe(f: dict[str, Any]) -> str:
    if f.get("error"):
        return f"not injected: {f['error']}"
    who = f" rank {f['rank']}" if "rank" in f else f" {f['host']}" if "host" in f else ""
    how = ""
    if f["kind"] == "controller-kill":
        how = " (adopted)" if f.get("adopted") else " (restored)"
    back = f", back in {f['back_s']:.1f} s" if "back_s" in f else ""
    restored = f", restored {f['restored']}" if "restored" in f else ""
    peer = f" (peer {f['peer']})" if "peer" in f else ""
    return (
        f"gen {f['gen']}{who}: training again in {f['recovered_s']:.2f} s{how}{restored}{peer}"
        f"{back}"
    )


def losses_of(dirs: list[Path]) -> tuple[dict[tuple[int, int], str], list[str]]:
    """(rank, step) → loss over every generation's rank logs, and every step printed twice with
    two different losses (a restore that did not resume exactly)."""
    seen: dict[tuple[int, int], str] = {}
    clashes = []
    for path in sorted(p for logs in dirs for p in logs.glob("g*/rank*.log")):
        for m in LOSS.finditer(path.read_text(errors="replace")):
            key, loss = (int(m.group(1)), int(m.group(2))), m.group(3)
            if seen.setdefault(key, loss) != loss:
                clashes.append(f"rank {key[0]} step {key[1]}: {seen[key]} then {loss} ({path})")
    return seen, clashes


def reference(steps: int, tmp: Path) -> dict[tuple[int, int], str]:
    """The uninterrupted run: the same script, as many ranks on this machine, plain torchrun."""
    out = subprocess.run(
        [
            PY, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD),
            "--master-port", "29733", SCRIPT, "--steps", str(steps), "--save-every", "1000000000",
            "--no-memory", "--ckpt-dir", str(tmp / "reference-ckpt"),
        ],
        capture_output=True, text=True, timeout=1800, cwd=tmp,
        # TMPDIR: plain torchrun leaves a torchelastic_* dir there; this one goes with `tmp`.
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp)},
    )  # fmt: skip
    if out.returncode != 0:
        raise SoakError(f"the reference run failed: {out.stderr[-1500:]}")
    return {(int(m.group(1)), int(m.group(2))): m.group(3) for m in LOSS.finditer(out.stdout)}


def growth(samples: list[dict[str, Any]], warmup_s: float) -> list[dict[str, Any]]:
    """Per process (who, pid) that lived long enough: each metric's max over the first half of
    its samples after its own warm-up (start-up: agents connecting, a generation starting)
    against its max over the last quarter. A leak keeps climbing past the first half's peak;
    a process that lives a minute (an agent whose host was killed) cannot say, and is left out."""
    rows = []
    keys = sorted({(s["who"], s.get("pid")) for s in samples}, key=lambda k: (k[0], k[1] or 0))
    for who, pid in keys:
        mine = [s for s in samples if (s["who"], s.get("pid")) == (who, pid)]
        settled = [s for s in mine if s["t"] - mine[0]["t"] >= warmup_s]
        if len(settled) < 8:
            continue
        half, quarter = settled[: len(settled) // 2], settled[-max(1, len(settled) // 4) :]
        row: dict[str, Any] = {
            "who": who, "pid": pid, "samples": len(settled),
            "span_s": round(settled[-1]["t"] - settled[0]["t"]),
        }  # fmt: skip
        grew = []
        for metric in ("fds", "threads", "children", "rss_mib", "processes"):
            if metric not in settled[0]:
                continue
            early, late = max(s[metric] for s in half), max(s[metric] for s in quarter)
            row[metric] = f"{early:.0f}→{late:.0f}"
            if late - early > GROWTH[metric]:
                grew.append(metric)
        row["verdict"] = "grew: " + ", ".join(grew) if grew else "flat"
        rows.append(row)
    return rows


GROWTH_TABLE = Table(
    [
        Column(key="who", header="process", align="<"),
        Column(key="pid", header="pid"),
        Column(key="span_s", header="span s"),
        Column(key="fds", header="fds (peak early→late)", align="<"),
        Column(key="threads", header="threads", align="<"),
        Column(key="children", header="children", align="<"),
        Column(key="rss_mib", header="RSS MiB", align="<"),
        Column(key="processes", header="processes", align="<"),
        Column(key="verdict", header="verdict", align="<"),
    ],
    name="who",
)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=30.0, help="how long faults keep coming")
    p.add_argument("--fault-every", type=float, default=30.0, help="seconds between faults")
    p.add_argument("--step-time", type=float, default=0.1, help="seconds a step takes at least")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cycle", action="store_true", help="the faults in turn, not at random")
    p.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help=f"comma-separated, among {', '.join(ALL_FAULTS)} [all but controller-power]",
    )
    p.add_argument("--sample-every", type=float, default=5.0)
    p.add_argument(
        "--warmup-s", type=float, default=30.0, help="a process's first seconds are not compared"
    )
    p.add_argument("--keep", default=None, help="copy the job's directory (journal, logs) here")
    p.add_argument("--prefix", default="ftsk", help="testbed name prefix")
    p.add_argument("--subnet", default="10.213.52.0/24", help="testbed /24")
    p.add_argument("--json", default=None, help="also write everything to this file")
    args = p.parse_args()
    if args.minutes <= 0 or args.fault_every <= 0 or args.step_time <= 0:
        p.error("--minutes, --fault-every and --step-time must be more than 0")
    unknown = [f for f in args.faults.split(",") if f not in ALL_FAULTS]
    if unknown:
        p.error(f"--faults: unknown {', '.join(unknown)}; choose among {', '.join(ALL_FAULTS)}")
    if {"controller-kill", "controller-power"} <= set(args.faults.split(",")):
        # controller-power needs the standby, and with one a killed controller is taken over by
        # it, not resumed by hand (`ftrun resume` then points to the standby and starts nothing)
        p.error("--faults: controller-kill and controller-power cannot be combined")
    reason = unavailable_reason()
    if reason:
        print(f"soak: {reason}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally below runs

    tmp = Path(tempfile.mkdtemp(prefix="ftrun-soak-"))
    report: dict[str, Any] = {"config": vars(args)}
    soak: Soak | None = None
    try:
        hosts = len(HOSTS + SPARES) + ("controller-power" in args.faults.split(","))
        with Testbed(
            hosts, state_dir=tmp / "testbed", subnet=args.subnet, prefix=args.prefix
        ) as bed:
            soak = Soak(bed, tmp, args)
            print(f"soak: {soak.steps} steps on {', '.join(HOSTS)} (spares "
                  f"{', '.join(SPARES)}), a fault every {args.fault_every:g} s for "
                  f"{args.minutes:g} min", flush=True)  # fmt: skip
            try:
                report.update(soak.run())
            except SoakError as e:
                report["error"] = str(e)
            report["faults"] = soak.faults
            report["left_on_hosts"] = getattr(soak, "left", None)
            events = soak.events() if soak.job else []
            report["world_sizes"] = sorted(
                {e["world_size"] for e in events if e["kind"] == "generation_launched"}
            )
            report["finished"] = [e.get("state") for e in events if e["kind"] == "job_finished"]
            got, clashes = ({}, [])
            if soak.job:  # the primary's logs, and the standby's after a takeover
                got, clashes = losses_of(
                    [
                        tmp / "runs" / soak.job / "logs",
                        tmp / "runs" / ".standby" / STANDBY / soak.job / "logs",
                    ]
                )
            if args.keep and soak.job:
                shutil.copytree(tmp / "runs" / soak.job, Path(args.keep) / soak.job)
            soak.close()
    finally:
        if soak is not None:
            soak.close()
    try:
        if "error" not in report:
            ref = reference(soak.steps, tmp)
            differ = [k for k, v in got.items() if ref.get(k) != v]
            report["losses"] = {
                "compared": len(got), "differ": len(differ), "clashes": clashes[:10],
                "first_differ": [f"rank {r} step {s}: {got[(r, s)]} vs {ref.get((r, s))}"
                                 for r, s in sorted(differ)[:5]],
                "all_steps": sorted({s for _, s in got}) == list(range(1, soak.steps + 1)),
                "not_printed": soak.steps * WORLD - len(got),
            }  # fmt: skip
        report["growth"] = growth(soak.samples if soak else [], args.warmup_s)
        report["samples"] = soak.samples if soak else []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return summarize(report, args)


def summarize(report: dict[str, Any], args: argparse.Namespace) -> int:
    faults = report.get("faults", [])
    by_kind: dict[str, list[float]] = {}
    for f in faults:
        if "recovered_s" in f:
            by_kind.setdefault(f["kind"], []).append(f["recovered_s"])
    print()
    print("fault            count  training again: median  max")
    for kind in ALL_FAULTS:
        times = by_kind.get(kind, [])
        if times:
            print(
                f"{kind:<16} {len(times):5d}  {benchlib.median(times):21.2f} s  {max(times):.2f} s"
            )
    print()
    print(GROWTH_TABLE.render(report.get("growth", [])))
    problems = []
    if report.get("error"):
        problems.append(report["error"])
    if report.get("rc") != 0 or report.get("finished") != ["succeeded"]:
        problems.append(f"the job ended {report.get('finished')} (exit {report.get('rc')})")
    losses = report.get("losses")
    plan_same = report.get("world_sizes") == [WORLD]
    if losses:
        print(
            f"\nlosses: {losses['compared']} (rank, step) pairs compared with the uninterrupted "
            f"run: {losses['differ']} differ, {len(losses['clashes'])} printed twice differently"
            + ("" if plan_same else f" (the plan changed: world sizes {report['world_sizes']})")
        )
        # Output survives a controller change (agent/unacked.py: what the dead controller did
        # not acknowledge is sent again to the resumed or takeover controller), so a controller
        # kill or power loss leaves every step printed. A (rank, step) line can still go with
        # its host (host-loss, partition: its agent dies with what it had not sent, and a step
        # already persisted is not run again): counted here, not a failure.
        if losses["not_printed"]:
            print(f"{losses['not_printed']} (rank, step) losses were never printed to a controller")
        missing = not losses["all_steps"]
        if plan_same and (losses["differ"] or losses["clashes"] or missing):
            why = losses["first_differ"] or losses["clashes"] or "a step no rank's line shows"
            problems.append(f"losses: {why}")
    grew = [r for r in report.get("growth", []) if r["verdict"] != "flat"]
    if grew:
        problems.append("growth: " + "; ".join(f"{r['who']} {r['verdict']}" for r in grew))
    if report.get("left_on_hosts"):
        problems.append(f"left on hosts: {report['left_on_hosts']}")
    if args.json:
        benchlib.write_json(args.json, report)
    print("\nsoak: " + ("OK" if not problems else "FAILED: " + " | ".join(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
