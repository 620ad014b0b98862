#!/usr/bin/env python3
"""Host lost → training again: ftrun (spare, shrink) vs plain elastic torchrun, one run.

On the namespace testbed (scripts/testbed.sh, docs/testbed.md: hosts node1..node4 with real sshd
and TCP, one shared filesystem), the same script (tests/bin/train_toy.py: DDP on gloo, one rank
per host, 50 ms steps, torch.save to a shared dir every 5 steps, resumes from it) runs on node1,
node2 and node3. When a rank has printed step --fault-step, `testbed.sh kill node3` powers node3
off: its link goes down first (no FIN or RST reaches anyone), then every process on it is
SIGKILLed. Measured: fault (just before the kill) → the first training step after the restart,
read from the `STEP n t=<wall time>` line that a rank prints after `resumed from step` (every
host shares the machine's clock). Modes, alternated trial by trial:

  torchrun      the anchor: `torchrun --nnodes 2:3 --nproc-per-node 1 --rdzv-backend c10d
                --rdzv-endpoint <node1>:PORT --rdzv-id UUID --max-restarts 3`, started on each
                host over ssh: torch's documented elastic setup (min 2, max 3 nodes). node1 hosts
                the c10d store, so node3 is the one killed. Time read from node1's output.
  ftrun-spare   `ftrun launch --hosts node1,node2,node3 --spares node4`: node4 replaces node3.
  ftrun-shrink  `ftrun launch --hosts node1,node2,node3 --min-nodes 2`: the job goes on on 2.
  ftrun-peer, ftrun-storage, ftrun-ckpt-shrink
                tests/bin/ckpt_train.py (ftrun.checkpoint, a snapshot every step, persisted
                every --persist-every): the spare with the peer copy, the spare without it
                (storage), and the shrink (the survivors' own memory, in the new layout).
  torchrun-store, ftrun-standby
                the controller's machine lost (issue 36): torchrun's single point, the host of
                its c10d store (node1), powered off, the survivors read on node2; ftrun launched
                from inside node5 (`ip netns exec`: the controller runs there) with node4 as
                spare and `--standby`, node5 powered off: the standby adopts the running
                generation (recovery: the adoption; `phases` has the takeover's start).
                For ftrun, ranks' output reaches the controller's stdout as `[rankN]: ...`; the
                journal (`first_step` of the new generation, `ftrun inspect --json`: detected_s,
                recovered_s) is the cross-check. Each trial ends with SIGINT to the controller's
                process group (a Ctrl-C), after which no process may be left on any host.

What torchrun does (torch.distributed.elastic, read in site-packages, torch 2.13): the agent on
each host only watches its own workers (`_invoke_run`: every --monitor-interval it polls them;
while they are HEALTHY it restarts only when `num_nodes_waiting() > 0`, i.e. for a node that
*joins*). A dead node is noticed only inside a rendezvous round (`_sanitize` drops nodes with no
keep-alive for 5 s × 3), and a round starts only after a local worker fails. After a silent host
loss the surviving workers block in a gloo allreduce with the dead peer and fail only at the
process group's timeout (gloo's default: 30 min); only then would the agents re-rendezvous, and
with 2 of 3 nodes a round completes only after `last_call` (30 s) more. Measured here: node1 and
node2 stop after the fault step, torchrun prints nothing, agents and workers are still there at
--wait-s: "not recovered". Even a kill that lets RSTs out (node3's processes SIGKILLed, link up;
tried once by hand) is no better here: the survivors fail at once and re-rendezvous after ≈ 35-45
s, but the new 2-node worker groups die in gloo's connectFullMesh ("Connection refused" to
node1), which looks like pytorch/pytorch#135712 (the agent-shared TCPStore keeps the previous
round's keys); no step within 100 s.

After every trial, every process on every host except the host's sshd is gone (leftovers are
recorded, then SIGKILLed), and node3 is powered on again. The testbed uses its own prefix,
subnet and state dir (defaults ftbf, 10.213.49.0/24) and is always torn down at the end.

    python scripts/bench_failover.py [--trials 3] [--only torchrun,ftrun-spare,ftrun-shrink,...]
                                     [--wait-s 60] [--json FILE]

Target (DESIGN.md §9): host lost → training again ≤ 10 s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import benchlib
import psutil
from benchlib import Column, Run, Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from ftrun.agent import workdir  # noqa: E402
from tests.testbed import Host, Testbed, unavailable_reason  # noqa: E402

SCRIPT = str(ROOT / "tests" / "bin" / "train_toy.py")
CKPT_SCRIPT = str(ROOT / "tests" / "bin" / "ckpt_train.py")
PY = sys.executable
# ftrun.checkpoint with a snapshot every step: spare node4 with the peer tier on / off (storage
# only), and no spare (a shrink to 2: the survivors' own memory, resharded)
CKPT_MODES = ("ftrun-peer", "ftrun-storage", "ftrun-ckpt-shrink", "ftrun-standby")
MODES = (
    "torchrun",
    "ftrun-spare",
    "ftrun-shrink",
    *CKPT_MODES[:3],
    "torchrun-store",
    CKPT_MODES[3],
)
# The controller's machine lost (issue 36): ftrun's controller runs on node5 (launched there, in its
# namespace) with node4 as spare and standby; torchrun's equivalent single point is the host of
# its c10d store, node1, and the survivors' output is read on node2.
CONTROLLER_HOST = "node5"
HOSTS = ("node1", "node2", "node3")  # the job's hosts; node4 is the spare
VICTIM = "node3"
STEP = re.compile(r"^(?:\[rank(\d+)\]:\s*)?STEP (\d+) t=([\d.]+)")
RESUMED = re.compile(r"^(?:\[rank(\d+)\]:\s*)?resumed from step (\d+)")
TARGET_S = 10.0
BOX = "│╭╮╰╯─┃━"


def recovery(lines: list[str], since: int) -> tuple[float, int, int] | None:
    """(wall time, step, resumed-from step) of the first step after a `resumed from step` line
    at or after line `since` (the earliest of the ranks' lines for that step); None if none yet."""
    resumed, first, times = None, None, []
    for line in lines[since:]:
        if resumed is None:
            m = RESUMED.search(line)
            if m:
                resumed = int(m.group(2))
            continue
        m = STEP.search(line)
        if m and (first is None or int(m.group(2)) == first):
            first = int(m.group(2))
            times.append(float(m.group(3)))
    return (min(times), first, resumed) if first is not None else None


LOSS = re.compile(r"LOSS rank=\d+ step=(\d+) ")


def journal_recovery(run_dir: Path) -> tuple[float, int | None, int | None] | None:
    """For ftrun.checkpoint's script: (wall time, step, restored step) of generation 2's first
    step as the journal has it (the controller heard it then), None if not yet."""
    events = journal_events(run_dir)
    first = next((e for e in events if e.get("kind") == "first_step" and e.get("gen") == 2), None)
    if first is None:
        return None
    restored = next(
        (e for e in events if e.get("kind") == "checkpoint_restored" and e.get("gen") == 2), {}
    )
    return first["t"], first.get("step"), restored.get("step")


def loss_step(lines: list[str]) -> int:
    """The newest step tests/bin/ckpt_train.py printed a loss for (0: none yet)."""
    return max((int(m.group(1)) for m in map(LOSS.search, lines[-200:]) if m), default=0)


def last_step(lines: list[str]) -> int | None:
    steps = [int(m.group(2)) for m in map(STEP.search, lines) if m]
    return steps[-1] if steps else None


def error_summary(lines: list[str], rc: int | None) -> str:
    """The gist of a launcher's failure: its last meaningful lines, box drawing stripped."""
    clean = [line.strip().strip(BOX).strip() for line in lines]
    clean = [
        c
        for c in clean
        if c and c != "Error" and not c.startswith(("Try '", "Usage:")) and not set(c) <= set(BOX)
    ]
    return (
        " / ".join(clean[-2:]) + (f" (exit {rc})" if rc is not None else "")
        if clean
        else f"exited {rc} with no output"
    )


class Bench:
    def __init__(self, bed: Testbed, tmp: Path, args: argparse.Namespace) -> None:
        self.bed, self.tmp, self.args = bed, tmp, args
        self.train = [
            "--steps",
            "100000",
            "--step-time",
            str(args.step_time),
            "--ckpt-every",
            str(args.ckpt_every),
        ]
        self.ckpt_train = [
            "--steps",
            "100000",
            "--step-time",
            str(args.step_time),
            "--save-every",
            "1",
            "--persist-every",
            str(args.persist_every),
        ]
        self.victim_down = False
        self.victim = VICTIM

    # -- hosts ---------------------------------------------------------------------------------

    def host_procs(self, host: Host) -> list[psutil.Process]:
        """Processes on the host other than its sshd daemon."""
        sshd = self.bed.state_dir / host.name / "sshd.pid"
        try:
            daemon = int(sshd.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            daemon = -1
        out = []
        for pid in self.bed.pids(host):
            if pid == daemon:
                continue
            try:
                out.append(psutil.Process(pid))
            except psutil.Error:
                continue
        return out

    def leftovers(self, wait_s: float) -> dict[str, list[str]]:
        """What is still running on each host after up to wait_s (processes may be exiting)."""
        deadline = time.monotonic() + wait_s
        while True:
            found: dict[str, list[str]] = {}
            for host in self.bed.hosts:
                procs = self.host_procs(host)
                if procs:
                    found[host.name] = [describe(p) for p in procs]
            if not found or time.monotonic() >= deadline:
                return found
            time.sleep(0.2)

    def clean_hosts(self) -> None:
        """SIGKILL everything but sshd on every host; raise if something survives."""
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            procs = [p for h in self.bed.hosts for p in self.host_procs(h)]
            if not procs:
                return
            for p in procs:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            time.sleep(0.2)
        raise RuntimeError(f"processes survive on the testbed: {self.leftovers(0)}")

    def stop_takeover(self, timeout_s: float) -> int | None:
        """Ctrl-C to the standby's controller (on node4, where it took the job over)."""
        procs = [
            p for p in self.host_procs(self.bed.host("node4"))
            if "resume" in " ".join(p.cmdline()) and "ftrun" in " ".join(p.cmdline())
        ]  # fmt: skip
        for p in procs:
            p.send_signal(signal.SIGINT)
        gone, alive = psutil.wait_procs(procs, timeout=timeout_s)
        return None if alive else (gone[0].returncode if gone else 0)

    def restore_victim(self) -> None:
        """Power node3 on again if this trial killed it (`start` also kills anything left)."""
        if self.victim_down:
            self.bed.start(self.victim)
            self.victim_down = False

    def kill_victim(self) -> tuple[float, float]:
        before = time.time()
        self.victim_down = True
        self.bed.kill(self.victim)
        return before, time.time()

    def quiet_then_stopped(self, run: Run, run_dir: Path) -> dict[str, Any]:
        """Before the power loss, what a standby on by default must not do: take the job over
        from a primary that is only busy. For --quiet-s nothing is injected; then the primary is
        stopped (SIGSTOP, a ^Z) for --stopped-s and continued. Counted from the journals and
        the agents' logs: takeovers started (the replica's takeover.log), host-lost verdicts
        (none is true here), and the waits the evidence made ("slow or stopped, not gone")."""
        a = self.args
        time.sleep(a.quiet_s)  # the window watched: the job trains, nothing is injected
        quiet = self.standby_counts(run_dir)
        steps_before = loss_step(run.lines)
        os.kill(run.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(a.stopped_s)  # the fault: how long the primary stays stopped
        finally:
            os.kill(run.proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + 15.0  # the primary reads what waited for it
        while loss_step(run.lines) <= steps_before and time.monotonic() < deadline:
            time.sleep(0.1)
        stopped = self.standby_counts(run_dir)
        return {
            "quiet_s": a.quiet_s,
            "quiet": quiet,
            "stopped_s": a.stopped_s,
            "after_stop": stopped,
            "stepped_across_stop": loss_step(run.lines) > steps_before,
        }

    @staticmethod
    def standby_counts(run_dir: Path) -> dict[str, int]:
        events = journal_events(run_dir)
        agents_said = "".join(p.read_text(errors="replace") for p in run_dir.glob("*/agents/*"))
        return {
            "takeovers": len(list(run_dir.glob(".standby/*/*/takeover.log"))),
            "host_lost": sum(
                e.get("kind") == "fault_detected" and e.get("fault") == "host-lost" for e in events
            ),
            "slow_waits": agents_said.count("it is slow or stopped, not gone"),
        }

    # -- the anchor ----------------------------------------------------------------------------

    def torchrun_trial(self, i: int, *, store: bool = False) -> dict[str, Any]:
        a = self.args
        self.victim, watch = ("node1", "node2") if store else (VICTIM, "node1")
        work = self.tmp / f"{'torchrun-store' if store else 'torchrun'}-{i}"
        ckpt = work / "ckpt"
        ckpt.mkdir(parents=True)
        endpoint = f"{self.bed.host('node1').address}:{a.port + i}"
        remote = (
            f"cd {shlex.quote(str(ROOT))} && PYTHONPATH={shlex.quote(str(ROOT))} exec "
            + shlex.join(
                [
                    PY,
                    "-m",
                    "torch.distributed.run",
                    "--nnodes",
                    "2:3",
                    "--nproc-per-node",
                    "1",
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    endpoint,
                    "--rdzv-id",
                    uuid.uuid4().hex,
                    "--max-restarts",
                    "3",
                    "--log-dir",
                    str(work / "torchelastic"),  # not /tmp for good
                    SCRIPT,
                    *self.train,
                    "--ckpt-dir",
                    str(ckpt),
                ]
            )
        )
        result: dict[str, Any] = {
            "mode": "torchrun-store" if store else "torchrun",
            "trial": i,
            "recovered": False,
            "recovery_s": None,
            "command": remote,
        }
        runs = {h: Run(self.bed.ssh_argv(h, remote), cwd=ROOT) for h in HOSTS}
        try:
            at = runs["node1"].wait_for(re.compile(rf"^STEP {a.fault_step} t="), a.start_timeout_s)
            if at is None:
                result["error"] = (
                    f"torchrun: no step {a.fault_step} on node1 within "
                    f"{a.start_timeout_s:g} s: "
                    + error_summary(runs["node1"].lines, runs["node1"].proc.poll())
                )
                return result
            since = {h: len(r.lines) for h, r in runs.items()}
            fault_t, killed_t = self.kill_victim()
            result.update(fault_t=fault_t, kill_s=killed_t - fault_t)
            watched = runs[watch]
            deadline = fault_t + a.wait_s
            found = None
            while time.time() < deadline and found is None:
                found = recovery(watched.lines, since[watch])
                time.sleep(0.05)
            if found:
                t, step, resumed = found
                result.update(
                    recovered=True, recovery_s=t - fault_t, first_step=step, resumed_from=resumed
                )
            result["after_fault"] = {
                h: [line for line in runs[h].lines[since[h] :] if not STEP.search(line)][
                    -a.keep_lines :
                ]
                for h in ("node1", "node2")
            }
            result["last_step"] = {h: last_step(runs[h].lines) for h in ("node1", "node2")}
            result["still_running"] = {
                h: [describe(p) for p in self.host_procs(self.bed.host(h))]
                for h in ("node1", "node2")
            }
            return result
        finally:
            for r in runs.values():
                r.close()
            result["tail"] = {h: r.lines[-a.keep_lines :] for h, r in runs.items()}
            self.clean_hosts()
            self.restore_victim()

    # -- ftrun ---------------------------------------------------------------------------------

    def ftrun_trial(self, mode: str, i: int) -> dict[str, Any]:
        a = self.args
        work = self.tmp / f"{mode}-{i}"
        ckpt, run_dir = work / "ckpt", work / "runs"
        ckpt.mkdir(parents=True)
        run_dir.mkdir()
        shrink = mode in ("ftrun-shrink", "ftrun-ckpt-shrink")
        policy = ["--min-nodes", "2"] if shrink else ["--spares", "node4"]
        standby = mode == "ftrun-standby"
        self.victim = CONTROLLER_HOST if standby else VICTIM
        # No --standby: over ssh the first spare (node4) keeps it by default (docs/standby.md).
        if mode == "ftrun-storage":
            policy += ["--peer-copy-rate", "0"]
        ckpt_mode = mode in CKPT_MODES
        script = [CKPT_SCRIPT, *self.ckpt_train] if ckpt_mode else [SCRIPT, *self.train]
        cmd = [
            PY,
            "-m",
            "ftrun",
            "launch",
            "--hosts",
            ",".join(HOSTS),
            *policy,
            "--ssh-config",
            str(self.bed.ssh_config),
            "--nproc-per-node",
            "1",
            "--run-dir",
            str(run_dir),
            "--job-name",
            "bench-failover",
            *script,
            "--ckpt-dir",
            str(ckpt),
        ]
        result: dict[str, Any] = {
            "mode": mode,
            "trial": i,
            "recovered": False,
            "recovery_s": None,
            "command": shlex.join(cmd),
        }
        if standby:  # typed on node5: the controller runs in its namespace
            cmd = ["ip", "netns", "exec", self.bed.host(CONTROLLER_HOST).namespace, *cmd]
        run = Run(cmd, env={"PYTHONPATH": str(ROOT)}, cwd=ROOT)
        try:
            fault_line = (
                rf"^\[rank\d+\]:\s*LOSS rank=\d+ step={a.fault_step} "
                if ckpt_mode
                else rf"^\[rank\d+\]:\s*STEP {a.fault_step} t="
            )
            at = run.wait_for(re.compile(fault_line), a.start_timeout_s)
            if at is None:
                rc = run.proc.poll()
                why = (
                    "launch failed: "
                    if rc is not None
                    else f"no step {a.fault_step} within {a.start_timeout_s:g} s: "
                )
                result["error"] = "ftrun: " + why + error_summary(run.lines, rc)
                result["launch_failed"] = rc is not None
                return result
            if standby:
                result["busy"] = self.quiet_then_stopped(run, run_dir)
            since = len(run.lines)
            fault_t, killed_t = self.kill_victim()
            result.update(fault_t=fault_t, kill_s=killed_t - fault_t)
            deadline = fault_t + a.wait_s
            found = None
            while time.time() < deadline and found is None and (standby or run.proc.poll() is None):
                if standby:
                    found = standby_recovery(run_dir)
                else:
                    found = journal_recovery(run_dir) if ckpt_mode else recovery(run.lines, since)
                time.sleep(0.05)
            if found:
                t, step, resumed = found
                result.update(
                    recovered=True, recovery_s=t - fault_t, first_step=step, resumed_from=resumed
                )
                time.sleep(1.0)  # let the journal catch up with the first step
                if ckpt_mode:  # the newest step printed before the kill
                    result["failed_at"] = max(
                        (int(m.group(1)) for m in map(LOSS.search, run.lines[:since]) if m),
                        default=None,
                    )
            elif run.proc.poll() is not None:
                result["error"] = "ftrun: exited after the fault: " + error_summary(
                    run.lines, run.proc.returncode
                )
            result["after_fault"] = [line for line in run.lines[since:] if not STEP.search(line)][
                -a.keep_lines :
            ]
            if standby:
                result["phases"] = standby_phases(run_dir, fault_t)
                rc = self.stop_takeover(a.stop_timeout_s)
            else:
                rc = run.interrupt(a.stop_timeout_s)
            result["stop_rc"] = rc
            if rc is None:
                result["stop_error"] = (
                    f"controller still running {a.stop_timeout_s:g} s after SIGINT"
                )
            result["left_on_hosts"] = self.leftovers(a.teardown_wait_s)
            if not standby:
                result["journal"] = journal_check(run_dir, fault_t)
            return result
        finally:
            run.close()
            result["tail"] = run.lines[-a.keep_lines :]
            if a.keep:  # the journals and logs (the standby's replica too), for a post-mortem
                shutil.copytree(run_dir, Path(a.keep) / f"{mode}-{i}", dirs_exist_ok=True)
            self.clean_hosts()
            self.restore_victim()


def replica_events(run_dir: Path) -> list[dict[str, Any]]:
    """The standby's replica of the journal, on node4 (docs/standby.md)."""
    return journal_events(run_dir, ".standby/node4/*/events.jsonl")


def journal_events(run_dir: Path, pattern: str = "*/events.jsonl") -> list[dict[str, Any]]:
    """Every event of the journals under `run_dir`; a line being written is skipped."""
    events = []
    for path in run_dir.glob(pattern):
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


def standby_recovery(run_dir: Path) -> tuple[float, int | None, int | None] | None:
    """The standby adopted the running generation: its ranks never stopped, so the controller
    is back in control (the first progress it hears) is training again, 0 steps lost."""
    events = replica_events(run_dir)
    adopted = next((e for e in events if e.get("kind") == "adopted"), None)
    if adopted is None:
        return None
    heard = [e for e in events if e.get("kind") == "progress" and e["t"] >= adopted["t"]]
    return adopted["t"], (heard[0].get("step") if heard else None), None


def standby_phases(run_dir: Path, fault_t: float) -> dict[str, float | None]:
    """Seconds from the power loss: the standby's agent took the primary for gone (detected),
    its takeover's controller came up (taken over), the generation adopted."""
    events = replica_events(run_dir)
    lost = [
        e
        for e in events
        if e.get("kind") == "fault_detected" and e.get("fault") == "controller-lost"
    ]
    found = {
        "detected": lost[0].get("detected_t") if lost else None,
        "taken_over": lost[0].get("taken_over_t") if lost else None,
        "adopted": next((e["t"] for e in events if e.get("kind") == "adopted"), None),
    }
    return {k: (round(v - fault_t, 3) if v else None) for k, v in found.items()}


def describe(p: psutil.Process) -> str:
    try:
        return f"{p.pid} {' '.join(p.cmdline()).strip()[:160] or p.name()}"
    except psutil.Error:
        return str(p.pid)


def journal_check(run_dir: Path, fault_t: float) -> dict[str, Any]:
    """From the job's events.jsonl and `ftrun inspect --json`: when ftrun saw the loss and the
    new generation's first step, on the benchmark's clock (fault_t = just before the kill)."""
    jobs = [p for p in run_dir.iterdir() if (p / "events.jsonl").is_file()]
    if len(jobs) != 1:
        return {"error": f"expected one job in {run_dir}, found {len(jobs)}"}
    out: dict[str, Any] = {"job": jobs[0].name}
    events = []
    for line in (jobs[0] / "events.jsonl").read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    detected = next(
        (e for e in events if e.get("kind") == "fault_detected" and e.get("t", 0) >= fault_t), None
    )
    if detected:
        out["detected_s"] = (detected.get("detected_t") or detected["t"]) - fault_t
        out["fault"] = detected.get("fault")
        out["host"] = detected.get("host")
        gen = detected.get("gen", 0)
        first = next(
            (e for e in events if e.get("kind") == "first_step" and e.get("gen", -1) > gen), None
        )
        if first:
            out["first_step_s"] = first["t"] - fault_t
            out["generation"] = first.get("gen")
        restored = next(
            (
                e
                for e in events
                if e.get("kind") == "checkpoint_restored" and e.get("gen", -1) > gen
            ),
            None,
        )
        if restored:
            out["restored_tier"], out["restored_step"] = restored.get("tier"), restored.get("step")
        fetched = [e for e in events if e.get("kind") == "peer_fetched" and e.get("gen", -1) > gen]
        if fetched:
            out["peer_fetched"] = [
                {k: e.get(k) for k in ("host", "which", "snapshots", "bytes", "seconds", "error")}
                for e in fetched
            ]
        launched = next(
            (
                e
                for e in events
                if e.get("kind") == "generation_launched" and e.get("gen", -1) > gen
            ),
            None,
        )
        if launched:
            out["new_hosts"] = launched.get("hosts")
            out["world_size"] = launched.get("world_size")
    insp = subprocess.run(
        [PY, "-m", "ftrun", "inspect", jobs[0].name, "--json", "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if insp.returncode != 0:
        out["inspect_error"] = error_summary(
            insp.stderr.splitlines() or insp.stdout.splitlines(), insp.returncode
        )
        return out
    try:
        view = json.loads(insp.stdout)
    except json.JSONDecodeError:
        out["inspect_error"] = f"not JSON: {insp.stdout[:200]!r}"
        return out
    out["incidents"] = [
        {
            k: inc.get(k)
            for k in ("kind", "decision", "host", "detected_s", "recovered_s", "lost_steps")
        }
        for inc in view.get("incidents", [])
    ]
    return out


def summarize(results: list[dict[str, Any]], mode: str, wait_s: float) -> dict[str, Any]:
    mine = [r for r in results if r["mode"] == mode]
    rec = benchlib.summarize(r["recovery_s"] if r["recovered"] else None for r in mine)
    journals = [r.get("journal", {}) for r in mine]
    return {
        "mode": mode,
        "trials": rec.trials,
        "recovered": rec.ok,
        "median_s": rec.median,
        "min_s": rec.min,
        "max_s": rec.max,
        "journal_first_step_median_s": benchlib.median(j.get("first_step_s") for j in journals),
        "detected_median_s": benchlib.median(j.get("detected_s") for j in journals),
        "trials_with_leftovers": sum(bool(r.get("left_on_hosts")) for r in mine),
        "tiers": "/".join(sorted({str(j.get("restored_tier")) for j in journals if j})) or None,
        "steps_lost_median": benchlib.median(
            r["failed_at"] - r["resumed_from"]
            for r in mine
            if r.get("failed_at") is not None and r.get("resumed_from") is not None
        ),
        "errors": sorted({r["error"] for r in mine if r.get("error")}),
        "wait_s": wait_s,
    }


TABLE = Table(
    [
        Column(key="mode", header="mode", align="<"),
        Column(key="trials", header="trials"),
        Column(key="recovered_of", header="recovered"),
        Column(key="median_s", header="median s", spec=".2f", ratio=".3f"),
        Column(key="spread", header="min–max s"),
        Column(key="detected_median_s", header="detected s", spec=".2f"),
        Column(key="journal_first_step_median_s", header="journal s", spec=".2f"),
        Column(key="tiers", header="restored from", align="<"),
        Column(key="steps_lost_median", header="steps lost", spec=".1f"),
        Column(key="verdict", header=f"target ≤ {TARGET_S:g} s", align="<"),
    ],
    name="mode",
    anchor="torchrun",
)


def print_table(summary: list[dict[str, Any]], wait_s: float) -> None:
    rows = []
    for s in summary:
        verdict = ""
        if s["median_s"] is not None and s["mode"] != "torchrun":
            verdict = "met" if s["median_s"] <= TARGET_S else "MISSED"
        elif s["median_s"] is None and s["trials"]:
            verdict = f"not recovered within {wait_s:g} s" if not s["errors"] else s["errors"][0]
        spread = None if s["min_s"] is None else f"{s['min_s']:.2f}–{s['max_s']:.2f}"
        rows.append(
            {
                **s,
                "recovered_of": f"{s['recovered']}/{s['trials']}",
                "spread": spread,
                "verdict": verdict,
            }
        )
    print()
    print(TABLE.render(rows))
    for s in summary:
        if s["trials_with_leftovers"]:
            print(
                f"{s['mode']}: processes left on hosts after SIGINT in "
                f"{s['trials_with_leftovers']}/{s['trials']} trials (see --json)"
            )


def show(r: dict[str, Any], n: int, wait_s: float) -> str:
    head = f"trial {r['trial'] + 1}/{n} {r['mode']:<13} host lost → first step again: "
    if r.get("error") and not r["recovered"]:
        return head + r["error"]
    if not r["recovered"]:
        last, said = r.get("last_step", {}), r.get("after_fault")
        if isinstance(said, dict):  # torchrun: what the survivors did
            running = r.get("still_running", {})
            return head + (
                f"not recovered within {wait_s:g} s  (last step: node1 "
                f"{last.get('node1')}, node2 {last.get('node2')}; other lines after the "
                f"fault: {sum(map(len, said.values()))}; processes still on "
                f"node1/node2: "
                f"{sum(map(len, running.values()))})"
            )
        return head + f"not recovered within {wait_s:g} s"

    extra = ""
    if r.get("phases"):
        extra += f"  (phases after the power loss, s: {r['phases']})"
    if "busy" in r:
        b = r["busy"]
        extra += (
            f"  (before it: {b['quiet_s']:g} s quiet {b['quiet']}, then stopped "
            f"{b['stopped_s']:g} s: {b['after_stop']}, stepped on: {b['stepped_across_stop']})"
        )
    if "journal" in r:
        j = r["journal"]
        extra = (
            f"  (journal: detected {fmt(j.get('detected_s'))}, first step "
            f"{fmt(j.get('first_step_s'))}, hosts {j.get('new_hosts')})"
        )
    return (
        head + f"{r['recovery_s']:.3f} s, step {r['first_step']} resumed from "
        f"{r['resumed_from']}" + extra
    )


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f} s"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=3)
    p.add_argument(
        "--only", default=",".join(MODES), help=f"comma-separated modes among {', '.join(MODES)}"
    )
    p.add_argument(
        "--wait-s",
        type=float,
        default=60.0,
        help="after the fault, how long to wait for a step before 'not recovered'",
    )
    p.add_argument("--fault-step", type=int, default=20, help="kill node3 once a rank prints it")
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument(
        "--persist-every",
        type=int,
        default=8,
        help="ftrun-peer/-storage/-ckpt-shrink: a snapshot every step, persisted every N",
    )
    p.add_argument(
        "--start-timeout-s",
        type=float,
        default=180.0,
        help="how long the job may take to reach --fault-step",
    )
    p.add_argument(
        "--stop-timeout-s",
        type=float,
        default=60.0,
        help="how long the ftrun controller may take to exit after SIGINT",
    )
    p.add_argument(
        "--teardown-wait-s",
        type=float,
        default=10.0,
        help="after the controller exits, how long hosts may take to be empty",
    )
    p.add_argument("--port", type=int, default=29611, help="torchrun's c10d port (+ trial)")
    p.add_argument("--prefix", default="ftbf", help="testbed name prefix")
    p.add_argument("--subnet", default="10.213.49.0/24", help="testbed /24")
    p.add_argument(
        "--keep-lines", type=int, default=40, help="output lines kept per host in --json"
    )
    p.add_argument(
        "--quiet-s",
        type=float,
        default=0.0,
        help="ftrun-standby: before the power loss, watch the job this long for false takeovers",
    )
    p.add_argument(
        "--stopped-s",
        type=float,
        default=0.0,
        help="ftrun-standby: then stop the primary (SIGSTOP) this long; it must keep its job",
    )
    p.add_argument(
        "--stress",
        type=int,
        default=0,
        help="run `stress-ng --cpu N` beside every trial (a busy machine) [0: none]",
    )
    p.add_argument("--keep", default=None, help="copy each ftrun trial's run dir here")
    p.add_argument("--json", default=None, help="also write every trial to this file")
    args = p.parse_args()
    modes = args.only.split(",")
    bad = [m for m in modes if m not in MODES]
    if bad or args.trials < 1:
        p.error(
            f"unknown mode(s) {bad}; choose among {', '.join(MODES)}"
            if bad
            else "--trials must be ≥ 1"
        )
    reason = unavailable_reason()
    if reason:
        print(f"bench_failover: {reason}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally below runs

    results: list[dict[str, Any]] = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    stress = (
        subprocess.Popen(["stress-ng", "--cpu", str(args.stress)], stdout=subprocess.DEVNULL)
        if args.stress
        else None
    )
    try:
        with Testbed(5, state_dir=tmp / "testbed", subnet=args.subnet, prefix=args.prefix) as bed:
            bench = Bench(bed, tmp, args)
            print(
                f"testbed {args.prefix} {args.subnet}: "
                + ", ".join(f"{h.name} {h.address}" for h in bed.hosts),
                flush=True,
            )
            skip: set[str] = set()
            for i in range(args.trials):
                for mode in modes:  # alternate, so drift on a shared machine hits every mode alike
                    if mode in skip:
                        continue
                    r = (
                        bench.torchrun_trial(i, store=mode == "torchrun-store")
                        if mode.startswith("torchrun")
                        else bench.ftrun_trial(mode, i)
                    )
                    results.append(r)
                    print(show(r, args.trials, args.wait_s), flush=True)
                    if r.get("launch_failed"):
                        skip.add(mode)  # it will fail the same way again; say so once
    finally:
        if stress is not None:
            stress.terminate()
            stress.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
        # The powered-off hosts' agents were SIGKILLed and could not remove their temp dirs; an
        # agent started later sweeps them (ftrun/agent/workdir.py), but none starts after the
        # last trial.
        workdir.sweep_stale(Path(tempfile.gettempdir()))

    summary = [summarize(results, m, args.wait_s) for m in modes]
    print_table(summary, args.wait_s)
    if args.json:
        config = {k: v for k, v in vars(args).items() if k != "json"}
        benchlib.write_json(args.json, {"config": config, "trials": results, "summary": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
