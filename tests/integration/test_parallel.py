"""ftrun.parallel with real torch ranks (gloo on CPU): recipes/gpt_pipeline.py under several
DP x PP layouts gives the same losses, a checkpoint saved under one layout continues under
another, and `ftrun profile` writes a valid profile.json.

Losses agree within LOSS_TOL, not bit for bit: the same gradient is summed in another order
(DDP's or our all-reduce over replicas, micro-batches accumulated per replica, pipeline stages
scaling by M), so float rounding differs by a few ulps per step and AdamW carries it on. Seen:
up to ~5e-7 absolute on losses of ~5.6 after 4 steps.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from ftrun import envcontract
from tests.conftest import Ftrun

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "gpt_pipeline.py"
LAYERS = 2
NAMES = ["tok", *(f"block{i}" for i in range(LAYERS)), "head"]
MODEL = ["--layers", str(LAYERS), "--dim", "32", "--context", "16", "--seed", "3"]
BATCH = ["--global-batch", "8", "--micro-batch", "2", "--lr", "1e-2"]
LOSS_TOL = 2e-5  # absolute, on losses of ~5.6


def plan(dp: int, pp: int, schedule: str = "1F1B", m: int = 2, spr: int = 1) -> dict:
    """A plan written by hand per the contract (what the planner would put in FTRUN_PLAN)."""
    n = pp * spr
    cuts = [round(i * len(NAMES) / n) for i in range(n + 1)]
    return {
        "version": 1,
        "dp": dp,
        "pp": pp,
        "stages": [[cuts[i], cuts[i + 1]] for i in range(n)],
        "stages_per_rank": spr,
        "layer_names": NAMES,
        "micro_batch": m,
        "micro_batches": 8 // (dp * m),
        "global_batch": 8,
        "schedule": schedule,
        "mesh": [[d * pp + p for p in range(pp)] for d in range(dp)],
        "predicted_step_s": 0.1,
    }


def run(
    ftrun: Ftrun,
    tmp_path: Path,
    *args: str,
    nproc: int = 0,
    layout: dict | None = None,
    timeout: float = 90,
    ok: bool = True,
) -> str:
    """The recipe under plain python (nproc 0) or torchrun; its output."""
    env = {**ftrun.env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop(envcontract.PLAN, None)
    if layout is not None:
        env[envcontract.PLAN] = json.dumps(layout)
    launcher = [sys.executable]
    if nproc:
        log_dir = tmp_path / f"torchrun-{uuid.uuid4().hex[:8]}"
        launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                     str(nproc), "--monitor-interval", "0.1", "--log-dir", str(log_dir)]  # fmt: skip
    proc = subprocess.Popen(
        [*launcher, str(RECIPE), *MODEL, *BATCH, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)
    assert (proc.returncode == 0) == ok, out[-4000:]
    return out


def losses(out: str) -> dict[int, float]:
    found = {int(s): float(v) for s, v in re.findall(r"^step (\d+) loss ([0-9.]+)", out, re.M)}
    assert found, out[-3000:]
    return found


def assert_close(got: dict[int, float], want: dict[int, float], what: str) -> float:
    assert got.keys() <= want.keys(), (what, got, want)
    worst = max(abs(got[s] - want[s]) for s in got)
    assert worst <= LOSS_TOL, f"{what}: {got} vs {want} (max diff {worst:.2e})"
    return worst


def test_losses_agree_across_layouts(ftrun, tmp_path):
    steps = ["--steps", "4", "--ckpt-every", "0"]
    reference = losses(run(ftrun, tmp_path, *steps))  # DP1 x PP1, one process, no plan
    assert sorted(reference) == [1, 2, 3, 4]
    assert reference[4] != reference[1]  # the weights do change
    layouts = {
        "DP2xPP1 (no plan)": run(ftrun, tmp_path, *steps, nproc=2),
        "DP1xPP2 1F1B": run(ftrun, tmp_path, *steps, nproc=2, layout=plan(1, 2, "1F1B")),
        "DP2xPP2 GPipe": run(ftrun, tmp_path, *steps, nproc=4, layout=plan(2, 2, "GPipe", m=1)),
        "DP1xPP2 Interleaved1F1B x2": run(
            ftrun, tmp_path, *steps, nproc=2, layout=plan(1, 2, "Interleaved1F1B", spr=2)
        ),
    }
    for what, out in layouts.items():
        assert "plan dp" in out
        got = losses(out)
        assert sorted(got) == [1, 2, 3, 4], what
        print(f"{what}: max abs diff {assert_close(got, reference, what):.2e}")


def test_checkpoint_saved_under_one_layout_continues_under_another(ftrun, tmp_path):
    ckpt = ["--ckpt-dir", str(tmp_path / "ckpt")]
    reference = losses(run(ftrun, tmp_path, "--steps", "4", "--ckpt-every", "0"))
    first = run(ftrun, tmp_path, "--steps", "2", *ckpt, nproc=2)  # DP2 x PP1
    assert_close(losses(first), reference, "before the switch")
    second = run(ftrun, tmp_path, "--steps", "4", *ckpt, nproc=2, layout=plan(1, 2, "1F1B"))
    assert "resumed from step 2 (storage)" in second, second[-3000:]
    got = losses(second)
    assert sorted(got) == [3, 4]  # the data position is the step: samples 16.. come next
    print(f"after DP2xPP1 -> DP1xPP2: max abs diff {assert_close(got, reference, 'after'):.2e}")


def test_memory_budget_refuses_a_stage_that_does_not_fit(ftrun, tmp_path):
    out = run(ftrun, tmp_path, "--steps", "1", "--memory-budget", "100KiB", ok=False)
    assert "but the memory budget is 0.1 MiB" in out, out[-3000:]


def test_profile_writes_every_layer(ftrun, tmp_path):
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = tmp_path / "prof.json"
    result = ftrun.run(
        "profile", "--out", str(out), str(RECIPE), *MODEL, *BATCH, "--memory-budget", "64MiB",
        env=env, timeout=60, cwd=str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(out.read_text())
    assert (doc["version"], doc["global_batch"], doc["device_memory_bytes"]) == (1, 8, 64 << 20)
    assert [layer["name"] for layer in doc["layers"]] == NAMES
    for layer in doc["layers"]:
        assert sum(layer["fwd_s"]) > 0 and sum(layer["bwd_s"]) > 0, layer
        assert min(layer["fwd_s"] + layer["bwd_s"]) >= 0, layer
        assert layer["state_bytes"] > 0 and layer["out_bytes"] > 0, layer
    assert all(layer["act_bytes"] > 0 for layer in doc["layers"][1:])
    assert "block1" in result.stdout and str(out) in result.stdout.replace("\n", "")
    assert not list(tmp_path.glob("checkpoints")), "profiling must not train or checkpoint"


@pytest.mark.parametrize(
    ("script", "words"),
    [
        ("bad_import.py", "failed (exit 1): ModuleNotFoundError"),
        ("hello.sh", "failed"),
        ("env_dump.py", "without writing a profile"),
    ],
)
def test_profile_of_a_script_that_cannot_be_profiled(ftrun, tmp_path, script, words):
    from tests.conftest import BIN

    result = ftrun.run("profile", "--out", str(tmp_path / "p.json"), str(BIN / script),
                       env={"PYTHONPATH": str(ROOT)}, timeout=60, cwd=str(tmp_path))  # fmt: skip
    assert result.returncode != 0
    text = " ".join(result.stderr.split())
    assert words in text and "hint:" in text and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "p.json").exists()
