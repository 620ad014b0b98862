"""`ftrun resume JOB`: the controller is SIGKILLed mid-run.

Within the agents' grace, the ranks train on without a controller and the resumed controller
adopts their generation: no rank restarted, no step lost or done twice. After the grace (the
agents fenced, the ranks died), it goes on from the freshest checkpoint with the launch's own
settings. Either way the losses are the uninterrupted run's, bit for bit. A running job and a
finished one are refused."""

from __future__ import annotations

import json
import os
import signal

import psutil

from tests.conftest import BIN, Output, tagged, wait_for
from tests.integration.ckpt_helpers import kill_and_adopt
from tests.integration.test_checkpoint_resume import losses

TRAIN = str(BIN / "ckpt_train.py")
ARGS = ("--nproc-per-node", "2", TRAIN, "--steps", "40", "--step-time", "0.05", "--no-memory")
GRACE = ("--controller-grace", "2")  # the agents fence 2 s after the controller is gone
# Killed after step 12 and two CLI calls (a second or two): 90 steps of ~0.1 s (a storage save
# each) are left then, so it is killed mid-run; 150 made the clean and the resumed run longer.
LONG_STEPS = 100
LONG = ("--nproc-per-node", "2", TRAIN, "--steps", str(LONG_STEPS), "--step-time", "0.05",
        "--no-memory")  # fmt: skip


def test_a_dead_controller_is_resumed_from_the_freshest_checkpoint(ftrun, test_id):
    clean = ftrun.run("launch", *LONG, timeout=120)
    assert clean.returncode == 0, clean.stdout[-3000:] + clean.stderr[-3000:]
    [clean_job] = [j["job_id"] for j in ftrun.status_json()]

    ftrun.env["RESUME_TEST_SECRET"] = "s3cret"
    proc = ftrun.start("launch", *GRACE, "--env", "RESUME_TEST_SECRET", *LONG)
    del ftrun.env["RESUME_TEST_SECRET"]
    out = Output(proc)
    out.wait_for("[rank1]: LOSS rank=1 step=12 ", 120)
    [job] = [j["job_id"] for j in ftrun.status_json() if j["job_id"] != clean_job]

    running = ftrun.run("resume", job, timeout=30)
    assert running.returncode == 2 and f"job {job} is running" in running.stderr

    os.kill(proc.pid, signal.SIGKILL)  # the machine running `ftrun launch` is gone, say
    proc.wait(timeout=10)
    wait_for(lambda: not tagged(test_id), 30, "the agents' grace to pass and the ranks to die")
    assert ftrun.status_json(job)["state"] != "succeeded"

    # Its --env value is not in the job directory: asked for by name, nothing started.
    unset = ftrun.run("resume", job, timeout=30)
    assert unset.returncode == 2 and "RESUME_TEST_SECRET" in unset.stderr, unset.stderr
    resumed = ftrun.run("resume", job, timeout=120, env={"RESUME_TEST_SECRET": "s3cret"})
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]

    restored = [
        line for line in resumed.stdout.splitlines() if "ftrun-checkpoint: restored step" in line
    ]
    assert len(restored) == 2 and all("from storage" in line for line in restored), restored
    [step] = {int(line.split("restored step ")[1].split()[0]) for line in restored}
    before, after = losses("".join(out.lines)), losses(resumed.stdout)
    assert step >= 5 and min(s for _, s in after) == step + 1  # a checkpoint, not a fresh start
    assert {(r, s) for r in (0, 1) for s in range(step + 1, LONG_STEPS + 1)} == set(after)
    want = losses(clean.stdout)
    for key, seen in [*before.items(), *after.items()]:
        assert seen == want[key], key  # every step of either run is the clean run's, bit for bit

    events = ftrun.events(job)
    [lost] = [e for e in events if e["kind"] == "fault_detected"]
    assert lost["fault"] == "controller-lost" and lost["fault_t"] < lost["detected_t"]
    [ended] = [e for e in events if e["kind"] == "generation_ended" and e["gen"] == 1]
    assert ended["outcome"] == "controller-lost"
    inspect = json.loads(ftrun.run("inspect", job, "--json", timeout=30).stdout)
    [incident] = inspect["incidents"]
    assert incident["kind"] == "controller-lost" and incident["recovered_s"] > 0
    assert inspect["state"] == "succeeded" and inspect["runs"] == 2

    again = ftrun.run("resume", job, timeout=30)
    assert again.returncode == 2
    assert f"job {job} already ended (succeeded): there is nothing to resume" in again.stderr
    assert not [p for p in psutil.process_iter() if p.pid == proc.pid]


def test_a_resume_within_the_grace_adopts_the_running_generation(ftrun, test_id, tmp_path):
    # 120 steps: the controller is killed at step 8 and the ranks must still be training when
    # the resume adopts them, for its first step again: after the kill the test waits for 3
    # steps, the resume starts (1-2 s), and the agent dials it at its next back-off try (0.25,
    # 0.5, 1, 2 s apart), ~4 s in all on a busy machine. 60 (2.6 s left) failed a clean-clone
    # CI on 3 workers: the ranks had finished when it adopted them.
    steps = ("--steps", "120")
    clean = ftrun.run("launch", *ARGS, *steps, timeout=120)
    assert clean.returncode == 0, clean.stdout[-3000:] + clean.stderr[-3000:]
    [clean_job] = [j["job_id"] for j in ftrun.status_json()]

    args = (*ARGS[:-1], *steps, "--record", str(tmp_path))  # memory tier on; what each rank did
    proc = ftrun.start("launch", *args)
    out = Output(proc)
    out.wait_for("[rank1]: LOSS rank=1 step=2 ", 120)
    [job] = [j["job_id"] for j in ftrun.status_json() if j["job_id"] != clean_job]
    out.wait_for("[rank1]: LOSS rank=1 step=8 ", 120)  # then killed at once
    resumed = kill_and_adopt(ftrun, proc, job, tmp_path, hosts="localhost", steps=120)
    events = ftrun.events(job)
    [adopted] = [e for e in events if e["kind"] == "adopted"]
    assert adopted["gen"] == 1 and adopted["hosts"] == ["localhost"]
    want, got = losses(clean.stdout), losses("".join(out.lines) + resumed.stdout)
    for key, seen in got.items():
        assert seen == want[key], key
    inspect = json.loads(ftrun.run("inspect", job, "--json", timeout=30).stdout)
    [incident] = inspect["incidents"]
    assert incident["kind"] == "controller-lost" and incident["recovered_s"] > 0
    assert inspect["state"] == "succeeded" and inspect["generation"] == 1
