"""Issue 33, the live snapshot's part: a restore is exactly the step it names, whatever the state
holds and whatever touches the weights between a save and the optimizer step; and the steps
lost stay at most one. A real process (tests/bin/shapes_child.py) trains a shape of
tests/integration/live_shapes.py and is SIGKILLed at a chosen moment; a fresh Manager restores
what it left, compared bit for bit with an uninterrupted run of the same shape."""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ftrun.checkpoint as ckpt
from tests.conftest import BIN
from tests.integration.ckpt_helpers import Managers, assert_same
from tests.integration.live_shapes import Shape

STEPS = 4
WARNING = "ftrun-checkpoint: warning: every save now copies the state before it returns"


@pytest.fixture
def managers(tmp_path):
    made = Managers(tmp_path)
    yield made
    made.cleanup()


def reference(tmp_path: Path, shape: str, step: int) -> dict[str, torch.Tensor]:
    """The shape's tensors after `step` steps of a run never stopped (it restores nothing first,
    as every run does: DCP makes the optimizer's state there)."""
    made = Managers(tmp_path / f"reference-{shape}-{step}")
    run = Shape(shape)
    try:
        made(memory=False).restore(run.state)
    finally:
        made.cleanup()
    for _ in range(step):
        run.step()
    return run.tensors()


def run_child(
    managers: Managers,
    test_id: str,
    shape: str,
    die: str,
    *,
    live: bool,
    steps: int = STEPS,
    agent: Path | None = None,
) -> tuple[list[int], str]:
    """Run tests/bin/shapes_child.py until it kills itself: ([saves, live saves], stderr).
    `agent`: a datagram socket where an agent would be (what the rank tells it)."""
    to_agent = {"FTRUN_AGENT_SOCK": str(agent), "FTRUN_GENERATION": "0"} if agent else {}
    out = subprocess.run(
        [
            sys.executable, str(BIN / "shapes_child.py"), "--job", managers.job,
            "--directory", str(managers.directory), "--steps", str(steps), "--shape", shape,
            "--die", die, *(["--live"] if live else []),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=BIN.parents[1],
        env={
            **os.environ, **to_agent, "FTRUN_TEST_ID": test_id, "PYTHONPATH": str(BIN.parents[1])
        },
    )  # fmt: skip
    assert out.returncode == -9, out.stdout[-2000:] + out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("SAVES "))
    return [int(w) for w in line.split()[1:]], out.stderr


def restored(managers: Managers, shape: str) -> tuple[ckpt.Restored, Shape]:
    run = Shape(shape)
    mgr = managers(persist_every=10**9)
    mgr.restore(run.state)
    assert mgr.restored is not None
    return mgr.restored, run


@pytest.mark.parametrize("shape", ["sam", "ema_eval", "manual_nograd", "ema_eval_data", "manual"])
def test_a_change_outside_the_optimizer_step_is_never_restored_as_the_saved_step(
    shape, managers, tmp_path, test_id, no_survivors
):
    """SAM's first pass, an EMA swapped in with load_state_dict, an update by hand under
    no_grad: each changes the live file after its manifest was committed (or the first full
    copy before it was complete). The guard sees it at the next forward pass (before the kill)
    or as the copy's last chunk lands, takes the snapshot back, copies at every save from then
    on and says so once: the restore is one whole step, exactly, at most one step behind."""
    path = tmp_path / "agent.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as agent:
        agent.bind(str(path))
        agent.setblocking(False)
        (saves, _), err = run_child(managers, test_id, shape, "forward", live=True, agent=path)
        told = []
        while True:
            try:
                told.append(json.loads(agent.recv(65536)))
            except BlockingIOError:
                break
    got, run = restored(managers, shape)
    assert got.tier == "memory" and got.step >= STEPS - 1
    assert_same(run.tensors(), reference(tmp_path, shape, got.step))
    assert not got.path.endswith("live.json") and err.count(WARNING) == 1, err[-3000:]
    events = [e for e in told if e["e"] == "tier"]  # journaled by the controller
    assert len(events) == 1 and events[0]["tier"] == "copies", told
    assert events[0]["from"] in ("live", "copies") and "changed" in events[0]["why"]


@pytest.mark.parametrize("shape", ["sam", "ema_eval", "manual_nograd", "big_buffer"])
def test_by_default_a_copy_that_a_change_reached_is_not_committed(
    shape, managers, tmp_path, test_id, no_survivors
):
    """The default: every save a full copy, in the background. A change before the copy is
    complete (the hand-written update comes at once; a 256 KiB buffer the forward pass
    updates) would be copied half old, half new: the guard sees it as the last chunk lands,
    that copy is not committed, and every later save copies before it returns."""
    assert ckpt.CheckpointConfig.__dataclass_fields__["live_snapshot"].default is False
    (saves, live_saves), err = run_child(managers, test_id, shape, "forward", live=False)
    assert live_saves == 0 and err.count("ftrun-checkpoint: warning") <= 1, err[-3000:]
    got, run = restored(managers, shape)
    assert got.tier == "memory" and got.step >= STEPS - 1
    assert_same(run.tensors(), reference(tmp_path, shape, got.step))


@pytest.mark.parametrize("shape", ["ema_module", "channels_last", "big_buffer"])
def test_what_the_live_file_does_not_hold_is_in_it_when_save_returns(
    shape, managers, tmp_path, test_id, no_survivors
):
    """An EMA module, a channels_last convolution, a 256 KiB buffer: not kept live, so save()
    copies them into the live file before its manifest (it once left them to the idle-priority
    thread, and a rank killed before that thread ran restored the last full copy: step 1 of
    10 on a busy machine). Killed as save() returns: the saved step, exactly, none lost."""
    (saves, live_saves), _ = run_child(managers, test_id, shape, "after-save", live=True)
    assert (saves, live_saves) == (STEPS, STEPS - 1)
    got, run = restored(managers, shape)
    assert (got.step, got.tier) == (STEPS, "memory") and got.path.endswith("live.json")
    assert_same(run.tensors(), reference(tmp_path, shape, STEPS))


@pytest.mark.parametrize("live", [True, False])
def test_killed_inside_save_a_rank_restores_one_whole_older_step(
    live, managers, tmp_path, test_id, no_survivors
):
    """Inside save(), as the manifest is about to be written: the step before, or the last full
    copy under the live snapshot, exactly."""
    run_child(managers, test_id, "plain", "save", live=live)
    got, run = restored(managers, "plain")
    assert got.tier == "memory" and got.step < STEPS
    assert got.step == (1 if live else STEPS - 1)  # the live snapshot's one full copy: save 1
    assert_same(run.tensors(), reference(tmp_path, "plain", got.step))


def test_a_state_dict_export_costs_the_tensors_size(managers):
    """Every adopted tensor has a storage of its own over its slice of the live file, so
    `torch.save(model.state_dict())` writes the model, not the whole file (once 36 MiB for a
    12 MiB model); and it still trains on the file."""
    run = Shape("plain")
    mgr = managers(persist_every=10**9, live_snapshot=True, full_copy_every=1000)
    mgr.restore(run.state)
    for step in range(1, 3):
        run.step()
        mgr.save(step, run.state)
    assert mgr.stats.live_saves == 1
    model_bytes = sum(t.numel() * t.element_size() for t in run.model.state_dict().values())
    buf = io.BytesIO()
    torch.save(run.model.state_dict(), buf)
    assert buf.tell() < model_bytes * 1.05 + 65536
    w = run.model.fc.weight
    assert w.untyped_storage().nbytes() == w.numel() * w.element_size()
    assert "live.data" in Path("/proc/self/maps").read_text()


def test_tensors_moved_in_again_leave_one_forward_hook(managers):
    """SAM's usual second step puts the weights back with `p.data = old_p` (new storage): the
    live snapshot moves them in again at each save, and its guard's forward pre-hook must not
    pile up, one per save."""
    run = Shape("plain")
    mgr = managers(persist_every=10**9, live_snapshot=True, full_copy_every=1000)
    mgr.restore(run.state)
    for step in range(1, 5):
        run.step()
        for p in run.model.parameters():
            p.data = p.data.clone()
        mgr.save(step, run.state)
    assert len(run.model._forward_pre_hooks) == 1
    mgr.close(persist_last=False)
    assert len(run.model._forward_pre_hooks) == 0


@pytest.mark.skipif(
    shutil.which("stress-ng") is None or not os.environ.get("FTRUN_TEST_STRESS"),
    reason="slow (~1 min): FTRUN_TEST_STRESS=1 and stress-ng run it",
)
@pytest.mark.parametrize("shape", ["ema_module", "sam"])
def test_beside_a_busy_machine_no_more_than_a_step_is_lost(
    shape, managers, tmp_path, test_id, no_survivors
):
    """The audit's conditions: `stress-ng --cpu 2` beside the rank, 10 steps, killed in the
    forward pass of step 11 (SAM: after its first pass)."""
    stress = subprocess.Popen(
        ["stress-ng", "--cpu", "2", "--timeout", "300"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        run_child(managers, test_id, shape, "forward", live=True, steps=10)
    finally:
        os.killpg(stress.pid, 9)
        stress.wait(timeout=30)
    got, run = restored(managers, shape)
    assert got.tier == "memory" and got.step >= 9
    assert_same(run.tensors(), reference(tmp_path, shape, got.step))
