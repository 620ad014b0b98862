"""Live re-planning on the namespace testbed (docs/planner.md): a GPT that needs pipeline stages to
fit its memory budget starts on 4 ssh hosts under the plan the planner chose; one host is powered
off → the job is re-planned for 3 hosts (another DP x PP), restored from the checkpoint resharded,
trains on; the host powers on again → the planner weighs growing back on its predictions
calibrated with the step times both plans measured (docs/planner.md, *A planner that learns*):
it grows back to the 4-host plan when that measured faster by the margin, else declines and says
why. The global batch never changes, and every loss the job printed, across the layouts, matches
an uninterrupted one-process run of the same seed."""

from __future__ import annotations

import re
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.conftest import Output, wait_for
from tests.testbed import Testbed

ROOT = Path(__file__).resolve().parents[2]
RECIPE = str(ROOT / "recipes" / "gpt_pipeline.py")
# 4 blocks of dim 64 hold ~3.7 MB of parameters + Adam state: a 3 MiB device needs PP >= 2.
MODEL = ("--layers", "4", "--dim", "64", "--global-batch", "16", "--memory-budget", "3MiB")
LOSS = re.compile(r"step (\d+) loss ([\d.]+)")
STEP_MS = re.compile(r"step (\d+) loss [\d.]+ \((\d+) ms\)")
FIGURES = re.compile(r"([\d.e+-]+) s/step vs ([\d.e+-]+) s/step")
# Not bitwise: the layouts sum the same per-sample gradients in another order (micro-batch
# sizes, the DP all-reduce, the pipeline's accumulation), and Adam carries the rounding on.
REL_TOLERANCE = 1e-3


def _processes_of(bed: Testbed, host: str) -> list[psutil.Process]:
    out = []
    for pid in bed.pids(host):
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE and proc.name() != "sshd":
                out.append(proc)
        except psutil.Error:
            continue
    return out


def kinds(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["kind"] == kind]


def _median_step_s(log: Path) -> float:
    """Rank 0's step times as it printed them, its first 2 left out (warm-up)."""
    times = [int(m[2]) / 1000 for m in STEP_MS.finditer(log.read_text())][2:]
    return statistics.median(times)


def losses(text: str) -> dict[int, float]:
    """step → loss as printed (a step run again after a restore must print the same loss)."""
    out: dict[int, float] = {}
    for m in LOSS.finditer(text):
        step, loss = int(m.group(1)), float(m.group(2))
        if step in out:
            assert loss == pytest.approx(out[step], rel=REL_TOLERANCE), (step, loss, out[step])
        out[step] = loss
    return out


@pytest.mark.ranks
@pytest.mark.testbed
# Profile, launch on 4 hosts, lose one, re-plan, power it on, grow: ~50 s on 2 workers, and its
# own waits allow more on a busier machine than the suite's 120 s default would (118 s, 3 workers).
@pytest.mark.timeout(300)
def test_a_lost_host_replans_dp_x_pp_and_a_grow_back_is_weighed_on_measured_steps(
    ftrun, testbed, tmp_path
):
    bed = testbed
    profile = tmp_path / "profile.json"
    made = ftrun.run("profile", "--out", str(profile), RECIPE, *MODEL, timeout=120)
    assert made.returncode == 0, made.stdout + made.stderr
    proc = ftrun.start(
        "launch",
        "--ssh-config",
        str(bed.ssh_config),
        "--hosts",
        "node1,node2,node3,node4",
        "--min-nodes",
        "2",
        "--profile",
        str(profile),
        "--replan-horizon",
        "36000",
        # Four hosts' ranks and agents share the 2 cores with the other worker's tests; a fresh
        # CI run saw a rank go 2 s (the default floor) without a step while node4's agent
        # started, and called it a hang. Hangs are not this test's subject.
        "--hang-floor",
        "15",
        RECIPE,
        *MODEL,
        "--steps",
        "100000",
    )
    out = Output(proc)
    try:
        out.wait_for("step 5 loss", 120)
        job_id = ftrun.job_id()
        # The 4-host plan measured (steady steps past the warm-up) before its host is lost.
        wait_for(lambda: kinds(ftrun.events(job_id), "plan_calibrated"), 60, "a calibration")
        bed.kill("node4")
        wait_for(
            lambda: any(e["gen"] == 2 for e in kinds(ftrun.events(job_id), "first_step")),
            90,
            "the re-planned generation to step",
        )
        bed.start("node4")  # powered on: the controller's retries reach it; grow or not?
        grown_log = ftrun.run_dir / job_id / "logs" / "g3" / "rank0.log"
        wait_for(
            lambda: (
                (grown_log.exists() and LOSS.search(grown_log.read_text()) is not None)
                or kinds(ftrun.events(job_id), "grow_declined")
            ),
            120,
            "the grown generation to print a loss, or the grow declined",
        )
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130, out.text()
    finally:
        if proc.poll() is None:
            proc.kill()
    events = ftrun.events(job_id)
    plans = kinds(events, "plan_chosen")
    declined = kinds(events, "grow_declined")
    grew = not declined
    assert [p["gen"] for p in plans] == ([1, 2, 3] if grew else [1, 2]), plans
    first, shrunk = plans[0]["layout"], plans[1]["layout"]
    assert first["pp"] >= 2, "the model does not fit one device: it needs a pipeline"
    assert first["dp"] * first["pp"] == 4
    assert shrunk["dp"] * shrunk["pp"] <= 3 and shrunk["pp"] >= 2
    assert {p["global_batch"] for p in (first, shrunk)} == {16}
    assert "node4" in plans[1]["why"]
    launched = kinds(events, "generation_launched")
    world = [4, shrunk["dp"] * shrunk["pp"]] + ([4] if grew else [])
    assert [g["world_size"] for g in launched] == world

    # The calibration against the steps the job ran: generation 1's plan measured, its factor
    # measured / the model's; the re-plan predicted with it (nothing else was measured yet)
    # unless the re-plan holds fewer virtual stages a rank: an Interleaved1F1B factor is not
    # passed down to a 1F1B plan (docs/planner.md, Transfer), which is then the model's alone.
    calibrated = kinds(events, "plan_calibrated")
    [g1] = [c for c in calibrated if c["gen"] == 1 and c["final"]]
    assert g1["factor"] == pytest.approx(g1["measured_step_s"] / g1["predicted_step_s"], rel=1e-3)
    printed = _median_step_s(ftrun.run_dir / job_id / "logs" / "g1" / "rank0.log")
    # The steps rank 0 timed (the journal's rate also holds the snapshot and the print).
    assert 0.7 < g1["measured_step_s"] / printed < 3.0, (g1, printed)
    assert plans[0]["calibration"]["source"] == "uncalibrated"
    passed = (
        shrunk["schedule"] == first["schedule"]
        or shrunk["stages_per_rank"] >= first["stages_per_rank"]
    )
    source = plans[1]["calibration"]["source"]
    assert source.startswith("from ") if passed else source == "uncalibrated", (source, shrunk)
    assert plans[1]["predicted_step_s"] == pytest.approx(
        plans[1]["model_step_s"] * (g1["factor"] if passed else 1.0), rel=1e-3
    )
    assert any(c["gen"] == 2 for c in calibrated), "the re-plan measured before the grow"
    # The grow weighed on calibrated figures: taken only when faster by the margin (5 %).
    reason = plans[2]["why"] if grew else declined[0]["reason"]
    assert "calibrated" in reason, reason
    new, old = (float(x) for x in FIGURES.search(reason).groups())  # type: ignore[union-attr]
    # The reason prints 3 significant figures: within their rounding of the margin itself
    # (0.117 vs 0.123 is 0.951, from 0.9485 to 0.9553) they cannot say which side it is.
    if abs(new / old - 0.95) > 0.01:
        assert (new < 0.95 * old) == grew, reason
    if grew:
        grown, source = plans[2]["layout"], plans[2]["calibration"]["source"]
        assert grown["dp"] * grown["pp"] == 4, "back on 4 hosts, a 4-rank plan"
        # Generation 1's plan is predicted at its own measurement; another 4-rank plan (a near
        # tie of another schedule) at the factor of the plans measured with its schedule first
        # (docs/planner.md, Transfer), which may rank it ahead.
        # (or none, when every plan measured holds more virtual stages a rank than it does).
        below = grown["stages_per_rank"] < min(first["stages_per_rank"], shrunk["stages_per_rank"])
        if grown == first:
            assert source == "measured", source
        else:
            assert source == "uncalibrated" if below else source.startswith("from "), source
        assert plans[2]["why"].startswith("grow")

    # status shows the plan running last; inspect each generation's, predicted and measured.
    shown = ftrun.run("inspect", job_id)
    assert shown.returncode == 0, shown.stdout
    assert shown.stdout.count("predicted ") == len(plans), shown.stdout
    assert "plan: DP" in ftrun.run("status", job_id).stdout

    # Every printed loss, whatever layout printed it, matches one process's uninterrupted run.
    logs = ftrun.run_dir / job_id / "logs"
    printed = {p.parent.name: p.read_text() for p in sorted(logs.glob("g*/rank0.log"))}
    assert sorted(printed) == ["g1", "g2", "g3"][: len(plans)]
    assert all(LOSS.search(text) for text in printed.values()), "every layout printed a loss"
    got = losses("".join(printed.values()))
    assert {3, 4} <= set(got)
    reference = subprocess.run(
        [sys.executable, RECIPE, *MODEL[:-2], "--steps", str(max(got)), "--ckpt-every", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )
    assert reference.returncode == 0, reference.stderr
    expected = losses(reference.stdout)
    for step, loss in sorted(got.items()):
        assert loss == pytest.approx(expected[step], rel=REL_TOLERANCE), (step, loss)
    # Nothing of the job is left on any host.
    wait_for(
        lambda: all(not _processes_of(bed, h.name) for h in bed.hosts), 15, "hosts to be clean"
    )
