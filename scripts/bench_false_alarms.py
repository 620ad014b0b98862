#!/usr/bin/env python3
"""False alarms under load: a real job and a second job beside it, on a machine that stress-ng
saturates (CPU 4x the cores, memory, disk); then real faults, detected under the same load.

    python scripts/bench_false_alarms.py [--duration 600] [--no-stress] [--json]

Timeline (all of it under stress-ng, stopped once the faults are done):
  0 ........................................ duration ..................... + fault window
  job A and job B train (2 ranks each,        then on job A, one at a time: kill-rank,
  tests/bin/train_toy.py): quiet, nothing     hang-rank, kill-agent (`ftrun chaos`); job B
  injected                                    trains on, untouched
Beside them all along the quiet window (--corpus, on by default), the conformance corpus's
ordinary scripts (tests/conformance/: rank 0 evaluating while the others wait, a final save
then barrier and destroy_process_group, DDP with and without destroy, DataLoader workers, ...)
run one after another under warm and cold ftrun, each judged by its progress regex where it
prints steps: every hang verdict there is false (nothing is injected), every non-zero exit a
mismatch with torchrun (each exits 0 under it).
Reported, from both jobs' journals and agent logs:
  false alarms  fault_detected with no injection behind it (host-lost / hang / crash), agents
                that fenced; target 0. Also what did not become an alarm: agent_slow (a live
                local agent late), controller_stalled (our loop late), "not fencing" warnings;
  heartbeat     lateness (gap between two heartbeats of an agent, less the interval), p50/p99/max,
                merged from the controllers' heartbeat_stats; and the controllers' loop lag;
  detection     per injected fault, fault → detected (hang: past the allowance), with the targets
                of DESIGN.md §9: crash ≤ 0.2 s, hang ≤ 2 s past the allowance, host lost ≤ 1.5 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import benchlib  # noqa: E402
from benchlib import Column, Table  # noqa: E402

from ftrun.controller.lateness import Histogram  # noqa: E402
from ftrun.journal.read import read_events  # noqa: E402

SCRIPT = str(ROOT / "tests" / "bin" / "train_toy.py")
PY = sys.executable
FAULTS = ("kill-rank", "hang-rank", "kill-agent")
KIND_OF = {"kill-rank": "crash", "hang-rank": "hang", "kill-agent": "host-lost"}
TARGET_S = {"crash": 0.2, "hang": 2.0, "host-lost": 1.5}
WAIT_S = 180.0  # for a start or a restart under load


class Job:
    """One `ftrun launch` in its own session, output to a file, its journal read on demand."""

    def __init__(self, name: str, run_dir: Path, steps_s: float) -> None:
        self.name, self.run_dir = name, run_dir
        self.out = open(run_dir.parent / f"{name}.out", "w")
        # Steps long enough that the job outlives the benchmark; it is stopped with SIGINT.
        self.proc = subprocess.Popen(
            [
                PY,
                "-m",
                "ftrun",
                "launch",
                "--run-dir",
                str(run_dir),
                "--job-name",
                name,
                "--nproc-per-node",
                "2",
                "--max-restarts",
                "5",
                SCRIPT,
                "--steps",
                "10000000",
                "--step-time",
                str(steps_s),
                "--width",
                "128",
            ],
            stdout=self.out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def job_dir(self) -> Path | None:
        found = [p for p in self.run_dir.glob("*") if (p / "events.jsonl").exists()]
        return found[0] if found else None

    def events(self) -> list[dict]:
        return read_events(self.job_dir) if self.job_dir else []

    def stop(self) -> int | None:
        """SIGINT: ranks get the grace period; the controller stops its agents."""
        try:
            stop_group(self.proc, signal.SIGINT, timeout_s=60)
            return self.proc.returncode
        finally:
            self.out.close()


def wait_until(predicate, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    return None


def first_step_of_gen(job: Job) -> bool:
    """A generation launched after the last fault has stepped (so it can take the next fault)."""
    evs = job.events()
    launched = [i for i, e in enumerate(evs) if e["kind"] == "generation_launched"]
    faults = [i for i, e in enumerate(evs) if e["kind"] == "fault_detected"]
    if not launched or (faults and faults[-1] > launched[-1]):
        return False
    gen = evs[launched[-1]]["gen"]
    return any(e["kind"] == "first_step" and e.get("gen") == gen for e in evs)


def stop_group(proc: subprocess.Popen, sig: int, timeout_s: float = 30) -> None:
    """Signal a session leader's group, then make sure every member is gone (stress-ng's vm
    worker takes a while to unmap its memory)."""
    for s in (sig, signal.SIGKILL):
        try:
            os.killpg(proc.pid, s)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            proc.poll()
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            continue
        break
    proc.wait(timeout=10)


def start_stress(duration_s: float, scratch: Path) -> subprocess.Popen | None:
    if not shutil.which("stress-ng"):
        sys.exit(
            "stress-ng is not installed (Debian: apt-get install stress-ng), or pass --no-stress"
        )
    cores = os.cpu_count() or 1
    cmd = [
        "stress-ng",
        "--cpu",
        str(4 * cores),
        "--vm",
        "1",
        "--vm-bytes",
        "30%",
        "--hdd",
        "1",
        "--hdd-bytes",
        "512m",
        "--temp-path",
        str(scratch),
        "--timeout",
        f"{int(duration_s)}s",
        "--quiet",
    ]
    return subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


def inject(job: Job, action: str, log: list[str]) -> dict:
    """One fault on job A once its generation steps; the journal's incident for it."""
    row = {
        "fault": action,
        "kind": KIND_OF[action],
        "detected_s": None,
        "injected_under_load": None,
    }
    if (
        not wait_until(lambda: first_step_of_gen(job) or job.proc.poll() is not None, WAIT_S)
        or job.proc.poll() is not None
    ):
        log.append(f"{action}: job A never stepped again; not injected")
        return row
    before = len([e for e in job.events() if e["kind"] == "fault_detected"])
    args = ["--rank", "1"] if action != "kill-agent" else []
    result = subprocess.run(
        [
            PY,
            "-m",
            "ftrun",
            "chaos",
            "--run-dir",
            str(job.run_dir),
            job.job_dir.name,
            action,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode != 0:
        log.append(f"{action}: chaos refused: {result.stderr.strip().splitlines()[0]}")
        return row
    detected = wait_until(
        lambda: [e for e in job.events() if e["kind"] == "fault_detected"][before:], WAIT_S
    )
    if not detected:
        log.append(f"{action}: not detected within {WAIT_S:g} s")
        return row
    inc = detected[0]
    row["injected"] = inc.get("injected")
    if inc["fault"] == "hang":
        row["detected_s"] = inc.get("past_allowance_s")
        row["allowance_s"] = inc.get("allowance_s")
    elif inc.get("fault_t") is not None:
        row["detected_s"] = round((inc.get("detected_t") or inc["t"]) - inc["fault_t"], 3)
    return row


def false_alarms(job: Job) -> dict:
    evs = job.events()
    faults = [e for e in evs if e["kind"] == "fault_detected" and not e.get("injected")]
    fenced = 0
    if job.job_dir:
        for log in (job.job_dir / "agents").glob("*.log"):
            fenced += sum(
                "fencing:" in line and "launcher is gone" not in line
                for line in log.read_text(errors="replace").splitlines()
            )
    not_fencing = 0
    if job.job_dir:
        for log in (job.job_dir / "agents").glob("*.log"):
            not_fencing += log.read_text(errors="replace").count("not fencing")
    return {
        "host_lost": sum(e["fault"] == "host-lost" for e in faults),
        "hang": sum(e["fault"] == "hang" for e in faults),
        "crash": sum(e["fault"] == "crash" for e in faults),
        "fenced": fenced,
        "agent_slow": sum(e["kind"] == "agent_slow" for e in evs),
        "controller_stalled": sum(e["kind"] == "controller_stalled" for e in evs),
        "not_fencing_warnings": not_fencing,
        "steps": max(
            [e.get("step") or 0 for e in evs if e["kind"] in ("progress", "first_step")], default=0
        ),
    }


def latency(jobs: list[Job], key: str) -> dict:
    stats = [e[key] for job in jobs for e in job.events() if e["kind"] == "heartbeat_stats"]
    merged = Histogram.merged([s.get("hist", {}) for s in stats])
    return {
        "n": merged.n,
        "p50_ms": merged.percentile_ms(0.5),
        "p99_ms": merged.percentile_ms(0.99),
        "max_ms": max([s.get("max_ms") or 0 for s in stats], default=None),
    }


CORPUS_LOOP = (
    "eval_pause",
    "final_save",
    "accum_ckpt",
    "ddp_destroy",
    "ddp_no_destroy",
    "dataloader_workers",
)
CORPUS_TABLE = Table(
    [
        Column(key="script", header="script", width=20, align="<"),
        Column(key="mode", header="mode", align="<"),
        Column(key="runs", header="runs"),
        Column(key="false_hangs", header="false hangs"),
        Column(key="other_faults", header="other faults"),
        Column(key="exit_stalls", header="exit stalls"),
        Column(key="nonzero", header="exit != 0"),
        Column(key="s_per_run", header="s/run", spec=".1f"),
    ]
)


def corpus_loop(until: float, scratch: Path, rows: dict[tuple[str, str], dict]) -> None:
    """Run corpus scripts under warm and cold ftrun, in turn, until `until` (monotonic); tally
    each run's incidents from its own journal into `rows`."""
    from tests.conformance import runner

    scripts = [s for s in runner.CORPUS if s.name in CORPUS_LOOP]
    n = 0
    while time.monotonic() < until:
        for script in scripts:
            for mode in ("warm", "cold"):
                if time.monotonic() >= until:
                    return
                n += 1
                run_dir = scratch / f"corpus-{n}"
                conf = scratch / f"corpus-{n}-conf"
                conf.mkdir(parents=True)
                env = {**os.environ, "CONF_DIR": str(conf), "PYTHONUNBUFFERED": "1"}
                t0 = time.monotonic()
                try:
                    code: int | None = subprocess.run(
                        runner.command(mode, script, killed=False, run_dir=run_dir),
                        cwd=runner.HERE,
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        timeout=300,
                    ).returncode
                except subprocess.TimeoutExpired:
                    code = None
                row = rows.setdefault(
                    (script.name, mode),
                    {
                        "script": script.name,
                        "mode": mode,
                        "runs": 0,
                        "false_hangs": 0,
                        "other_faults": 0,
                        "exit_stalls": 0,
                        "nonzero": 0,
                        "seconds": 0.0,
                    },
                )
                row["runs"] += 1
                row["seconds"] += time.monotonic() - t0
                row["nonzero"] += code != 0
                for job in run_dir.glob("*"):
                    for ev in read_events(job) if (job / "events.jsonl").exists() else []:
                        if ev["kind"] != "fault_detected":
                            continue
                        fault = ev.get("fault")
                        if fault == "hang":
                            row["false_hangs"] += 1
                        elif fault == "exit_hang":
                            row["exit_stalls"] += 1
                        else:
                            row["other_faults"] += 1
                shutil.rmtree(run_dir, ignore_errors=True)
                shutil.rmtree(conf, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--duration",
        type=float,
        default=600,
        help="seconds both jobs train under stress before any fault [600]",
    )
    p.add_argument(
        "--fault-window",
        type=float,
        default=120,
        help="stress-ng runs at most this much longer, for the faults [120]",
    )
    p.add_argument(
        "--stress",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="stress-ng: --cpu 4x cores, --vm 1 (40%% of memory), --hdd 1 [on]",
    )
    p.add_argument("--step-time", type=float, default=0.05, help="extra seconds per step [0.05]")
    p.add_argument(
        "--corpus",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the conformance corpus warm and cold beside the jobs [on]",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-false-alarms-"))
    stress = None
    jobs: list[Job] = []
    notes: list[str] = []
    try:
        t0 = time.monotonic()
        if args.stress:
            stress = start_stress(args.duration + args.fault_window, tmp)
        jobs = [Job(name, tmp / f"runs-{name}", args.step_time) for name in ("A", "B")]
        if not wait_until(lambda: all(first_step_of_gen(j) for j in jobs), WAIT_S):
            notes.append("a job did not reach its first step")
        quiet_from = faults_at = time.monotonic() - t0
        corpus_rows: dict[tuple[str, str], dict] = {}
        corpus = None
        if args.corpus:
            corpus = threading.Thread(
                target=corpus_loop,
                args=(t0 + args.duration, tmp / "corpus", corpus_rows),
                daemon=True,
            )
            corpus.start()
        wait_until(
            lambda: (
                time.monotonic() - t0 >= args.duration
                or any(j.proc.poll() is not None for j in jobs)
            ),
            args.duration + 10,
        )
        if corpus is not None:
            corpus.join(timeout=330)  # its last run ends within its own 300 s timeout
        faults_at = time.monotonic() - t0
        quiet = {j.name: false_alarms(j) for j in jobs}  # before anything is injected
        load = os.getloadavg()[0]
        rows = []
        for action in FAULTS:
            under = stress is not None and stress.poll() is None
            row = inject(jobs[0], action, notes)
            row["injected_under_load"] = under
            rows.append(row)
        b_alive = jobs[1].proc.poll() is None
        elapsed = time.monotonic() - t0
    finally:
        if stress is not None:
            stop_group(stress, signal.SIGTERM)
        codes = {j.name: j.stop() for j in jobs}
    total = {j.name: false_alarms(j) for j in jobs}
    # Job A's own injected faults are real; job B must have seen nothing at all, and A nothing
    # uninjected (false_alarms counts only fault_detected events with no injection behind them).
    result = {
        "duration_s": round(elapsed, 1),
        "quiet_window_s": round(faults_at - quiet_from, 1),
        "quiet_from_s": round(quiet_from, 1),
        "stress": stress is not None,
        "loadavg_1m": round(load, 1),
        "cores": os.cpu_count(),
        "quiet": quiet,
        "whole_run": total,
        "job_b_alive_through_a_faults": b_alive,
        "exit_codes": codes,
        "heartbeat_late": latency(jobs, "heartbeat_late"),
        "controller_loop_lag": latency(jobs, "loop_lag"),
        "faults": rows,
        "corpus": [
            {**r, "s_per_run": r["seconds"] / r["runs"] if r["runs"] else 0.0}
            for r in corpus_rows.values()
        ],
        "notes": notes,
        "dir": str(tmp),
    }
    if args.json:
        print(benchlib.to_json(result))
    else:
        print_table(result)


ALARMS = Table(
    [
        Column(key="job", header="job", align="<"),
        Column(key="host_lost", header="host lost"),
        Column(key="hang", header="hang"),
        Column(key="crash", header="crash"),
        Column(key="fenced", header="fenced"),
        Column(key="agent_slow", header="| slow"),
        Column(key="controller_stalled", header="stalled"),
        Column(key="not_fencing_warnings", header="not fenced"),
        Column(key="steps", header="steps"),
    ]
)
DETECTED = Table(
    [
        Column(key="fault", header="fault", align="<"),
        Column(key="kind", header="kind", align="<"),
        Column(key="detected_s", header="detected s", spec=".3f"),
        Column(key="target_s", header="target s", spec="g"),
        Column(key="under_load", header="under load", align="<"),
        Column(key="verdict", header="", align="<"),
    ]
)


def print_table(r: dict) -> None:
    print(
        f"\nfalse alarms under load: {r['duration_s']} s, stress-ng {'on' if r['stress'] else 'off'}"
        f", load average {r['loadavg_1m']} on {r['cores']} cores; both jobs training from "
        f"{r['quiet_from_s']} s, quiet window {r['quiet_window_s']} s, then the faults"
    )
    print(ALARMS.render([{"job": name, **c} for name, c in r["whole_run"].items()]))
    print("  (false alarms: left of '|', target 0; right: late but rightly not an alarm)")
    if r["corpus"]:
        print(
            "\nthe conformance corpus beside them (target: 0 false hangs, 0 stalls, 0 exit != 0):"
        )
        print(CORPUS_TABLE.render(r["corpus"]))
    for key, what in (
        ("heartbeat_late", "heartbeat lateness"),
        ("controller_loop_lag", "controller loop lag"),
    ):
        h = r[key]
        print(
            f"{what}: p50 {h['p50_ms']} ms, p99 {h['p99_ms']} ms, max {h['max_ms']} ms "
            f"({h['n']} samples)"
        )
    rows = []
    for row in r["faults"]:
        d, target = row["detected_s"], TARGET_S[row["kind"]]
        verdict = "" if d is None else ("ok" if d <= target else "OVER")
        if row["kind"] == "hang":
            verdict += " past allowance"
        rows.append(
            {
                **row,
                "target_s": target,
                "under_load": row["injected_under_load"],
                "verdict": verdict.strip(),
            }
        )
    print(DETECTED.render(rows))
    print(
        f"job B alive through job A's faults: {r['job_b_alive_through_a_faults']}; "
        f"exit codes {r['exit_codes']}"
    )
    for note in r["notes"]:
        print(f"note: {note}")
    print(f"journals: {r['dir']}")


if __name__ == "__main__":
    main()
