"""A preemption notice (--preempt-signal, what Slurm's --signal sends) on this machine, with no
Slurm: a script using ftrun.checkpoint commits a checkpoint at once and the job stops with exit
75 (preempted), a second `ftrun launch --job-id` of it resumes the same journal from that
checkpoint; a plain script gets the signal in its own handler, and its exit 0 on it is still the
preemption (the job is not done). The Slurm requeue is tests/integration/test_slurm.py's.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from tests.conftest import BIN, Ftrun, wait_for

TRAIN = str(BIN / "ckpt_train.py")


def events(job_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (job_dir / "events.jsonl").read_text().splitlines()]


def kinds(job_dir: Path, kind: str) -> list[dict]:
    return [e for e in events(job_dir) if e["kind"] == kind]


def test_a_notice_commits_a_checkpoint_stops_75_and_the_job_resumes_from_it(
    ftrun: Ftrun,
) -> None:
    # Neither the step nor the clock makes any save but the first a persist: only the notice.
    args = [TRAIN, "--steps", "40", "--step-time", "0.1", "--persist-every", "1000"]
    args += ["--persist-interval", "3600"]
    launch = ftrun.start("launch", "--job-id", "pre-1", "--nproc-per-node", "2", *args)
    job_dir = ftrun.run_dir / "pre-1"
    wait_for(
        lambda: (job_dir / "events.jsonl").exists() and kinds(job_dir, "first_step"), 120, "step 1"
    )
    os.kill(launch.pid, signal.SIGUSR2)
    out, _ = launch.communicate(timeout=120)
    assert launch.returncode == 75, out
    (fault,) = kinds(job_dir, "fault_detected")
    committed = fault["committed_step"]
    assert fault["fault"] == "preempted" and committed is not None, fault
    assert kinds(job_dir, "job_finished")[-1]["state"] == "preempted"
    assert kinds(job_dir, "generation_ended")[0]["step"] - committed <= 1

    again = ftrun.run("launch", "--job-id", "pre-1", "--nproc-per-node", "2", *args, timeout=180)
    assert again.returncode == 0, again.stderr
    assert f"RESTORED rank=0 step={committed} tier=storage" in again.stdout + again.stderr
    assert [e["gen"] for e in kinds(job_dir, "generation_launched")] == [1, 2]
    assert kinds(job_dir, "resumed")[0]["incident"] == fault["incident"]
    assert [e["run"] for e in kinds(job_dir, "job_started")] == [1, 2]
    finished = ftrun.run("launch", "--job-id", "pre-1", *args)
    assert finished.returncode == 2 and "already ended (succeeded)" in finished.stderr


def test_a_plain_script_gets_the_notice_in_its_handler_and_its_exit_0_is_no_success(
    ftrun: Ftrun, tmp_path: Path
) -> None:
    launch = ftrun.start(
        "launch", "--job-id", "pre-2", "--nproc-per-node", "2", "--preempt-signal", "USR1",
        "--progress-regex", r"step (\d+)", str(BIN / "signals.py"), "--dir", str(tmp_path),
        "--after-usr1", "0",
    )  # fmt: skip
    job_dir = ftrun.run_dir / "pre-2"
    wait_for(
        lambda: (job_dir / "events.jsonl").exists() and kinds(job_dir, "first_step"), 120, "step 1"
    )
    os.kill(launch.pid, signal.SIGUSR1)
    out, _ = launch.communicate(timeout=60)
    assert launch.returncode == 75, out
    assert sorted(p.name for p in tmp_path.glob("usr1-rank*")) == ["usr1-rank0", "usr1-rank1"]
    (fault,) = kinds(job_dir, "fault_detected")
    assert (fault["fault"], fault["committed_step"]) == ("preempted", None)
    assert kinds(job_dir, "job_finished")[-1]["state"] == "preempted"


def test_a_rank_that_installs_its_handler_after_the_notice_still_gets_it(
    ftrun: Ftrun, tmp_path: Path
) -> None:
    """A rank still importing when the notice comes has no handler yet (the signal would kill
    it, so it is not sent): it gets the notice once its handler is in."""
    launch = ftrun.start(
        "launch", "--job-id", "pre-3", "--nproc-per-node", "2", "--preempt-signal", "USR1",
        "--progress-regex", r"step (\d+)", str(BIN / "signals.py"), "--dir", str(tmp_path),
        "--after-usr1", "0", "--late-rank", "1",
    )  # fmt: skip
    job_dir = ftrun.run_dir / "pre-3"
    wait_for(
        lambda: (job_dir / "events.jsonl").exists() and kinds(job_dir, "first_step"), 120, "step 1"
    )
    os.kill(launch.pid, signal.SIGUSR1)
    wait_for(lambda: kinds(job_dir, "signal_delivered"), 60, "the notice to rank 0")
    assert [e["ranks"] for e in kinds(job_dir, "signal_delivered")] == [[0]]
    (tmp_path / "handlers-now").touch()
    out, _ = launch.communicate(timeout=60)
    assert launch.returncode == 75, out
    assert sorted(p.name for p in tmp_path.glob("usr1-rank*")) == ["usr1-rank0", "usr1-rank1"], out
    assert [e["ranks"] for e in kinds(job_dir, "signal_delivered")] == [[0], [1]]
