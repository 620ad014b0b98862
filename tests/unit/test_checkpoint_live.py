"""The live snapshot (ftrun/checkpoint/live.py): the state kept in the memory tier's file, so
that most saves copy nothing. A real process is SIGKILLed at the moments that matter, and a
fresh Manager restores what it left: the step it saved, exactly, while the state was that
step's; never the live file once the optimizer has changed it."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import ftrun.checkpoint as ckpt
from ftrun.checkpoint import live
from tests.conftest import BIN
from tests.integration.ckpt_helpers import Managers, Toy, assert_same

STEPS = 12
WIDTH = 1280  # 1280 x 1280 weights: 19 MiB of state with AdamW, over live.MIN_BYTES


@pytest.fixture
def managers(tmp_path):
    made = Managers(tmp_path)
    yield made
    made.cleanup()


def reference(tmp_path, step: int) -> dict[str, torch.Tensor]:
    """The Toy's tensors after `step` steps of a run that is never stopped. It restores nothing
    first, as every run does (DCP makes the optimizer's state there), and saves nothing."""
    made = Managers(tmp_path / f"reference-{step}")
    toy = Toy(width=WIDTH)
    try:
        made(memory=False).restore(toy.state)
    finally:
        made.cleanup()
    for _ in range(step):
        toy.step()
    return toy.tensors()


def run_child(managers: Managers, test_id: str, die: str, full_copy_every: int) -> list[int]:
    """Run tests/bin/live_child.py until it kills itself; returns its [saves, live saves]."""
    out = subprocess.run(
        [
            sys.executable,
            str(BIN / "live_child.py"),
            "--job",
            managers.job,
            "--directory",
            str(managers.directory),
            "--steps",
            str(STEPS),
            "--die",
            die,
            "--full-copy-every",
            str(full_copy_every),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=BIN.parents[1],
        env={**os.environ, "FTRUN_TEST_ID": test_id, "PYTHONPATH": str(BIN.parents[1])},
    )
    assert out.returncode == -9, out.stdout[-2000:] + out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("SAVES "))
    return [int(w) for w in line.split()[1:]]


def restored(managers: Managers) -> tuple[ckpt.Restored, Toy]:
    toy = Toy(width=WIDTH)
    mgr = managers(persist_every=10**9)
    mgr.restore(toy.state)
    assert mgr.restored is not None
    return mgr.restored, toy


def test_killed_before_its_optimizer_step_a_rank_restores_the_step_it_saved(
    managers, tmp_path, test_id, no_survivors
):
    """Every save after the first copied nothing; the file holds the last step, exactly."""
    saves, live_saves = run_child(managers, test_id, "forward", full_copy_every=1000)
    assert (saves, live_saves) == (STEPS, STEPS - 1)  # the first save is the one full copy
    got, toy = restored(managers)
    assert (got.step, got.tier) == (STEPS, "memory")
    assert got.path is not None and got.path.endswith("live.json")
    assert_same(toy.tensors(), reference(tmp_path, STEPS))
    assert toy.loader.position == STEPS and toy.extra["epoch"] == STEPS


def test_killed_after_its_optimizer_step_a_rank_restores_the_last_full_copy(
    managers, tmp_path, test_id, no_survivors
):
    """The optimizer step changed the live file, so it is no snapshot: the restore takes the
    newest full copy (saves 0, 5 and 10 are full copies: steps 1, 6 and 11), exactly."""
    saves, live_saves = run_child(managers, test_id, "optimizer", full_copy_every=5)
    assert (saves, live_saves) == (STEPS, STEPS - 3)
    got, toy = restored(managers)
    assert (got.step, got.tier) == (11, "memory")
    assert got.path is not None and "slot" in os.path.basename(got.path)
    assert_same(toy.tensors(), reference(tmp_path, 11))
    assert toy.loader.position == 11


def test_parameters_given_new_storage_move_into_the_live_file_again(
    managers, tmp_path, test_id, no_survivors
):
    """Two steps before the last, every parameter got new storage (as model.to() gives it):
    the live snapshot must follow them there, or it would hold their values of that step as
    the last one's."""
    run_child(managers, test_id, "replaced", full_copy_every=1000)
    got, toy = restored(managers)
    assert got.step == STEPS and got.path is not None and got.path.endswith("live.json")
    assert_same(toy.tensors(), reference(tmp_path, STEPS))


def test_killed_at_any_moment_a_rank_restores_one_whole_step(tmp_path, test_id, no_survivors):
    """SIGKILL at moments the test does not choose (inside a save, an optimizer step, a full
    copy): every restore is one step's state, bit for bit, never a mix of two."""
    rng = random.Random(5)
    for trial in range(3):
        made = Managers(tmp_path / f"trial{trial}")
        try:
            proc = subprocess.Popen(
                [
                    sys.executable, str(BIN / "live_child.py"), "--job", made.job,
                    "--directory", str(made.directory), "--steps", "100000", "--die", "never",
                    "--full-copy-every", "3",
                ],
                stdout=subprocess.PIPE,
                text=True,
                cwd=BIN.parents[1],
                env={**os.environ, "FTRUN_TEST_ID": test_id, "PYTHONPATH": str(BIN.parents[1])},
            )  # fmt: skip
            assert proc.stdout is not None
            try:
                assert "TRAINING\n" in iter(proc.stdout.readline, "")
                time.sleep(rng.uniform(0.0, 0.3))  # the fault's moment: what the test is about
            finally:
                proc.kill()
                proc.wait(timeout=30)
                proc.stdout.close()
            got, toy = restored(made)
            assert got.tier == "memory" and got.step >= 1  # the first full copy, at least
            assert_same(toy.tensors(), reference(tmp_path, got.step))
        finally:
            made.cleanup()


def test_training_on_after_close_leaves_the_last_snapshot_intact(managers):
    """close() takes the hooks away: the last live step is copied into a slot first, so an
    optimizer step after close() changes nothing a restore reads."""
    toy = Toy(width=WIDTH)
    mgr = managers(persist_every=10**9, full_copy_every=1000, live_snapshot=True)
    mgr.restore(toy.state)
    for step in range(1, 5):
        toy.step()
        mgr.save(step, toy.state)
    assert mgr.stats.live_saves == 3
    expected = toy.tensors()
    mgr.close(persist_last=False)
    assert "live.data" not in Path("/proc/self/maps").read_text()  # back in the heap
    toy.step()  # no hook any more: changes the tensors
    got, again = restored(managers)
    assert got.step == 4 and got.tier == "memory" and not got.path.endswith("live.json")
    assert_same(again.tensors(), expected)
    # A later Manager adopts them afresh.
    later = managers(
        managers.directory.parent / "later",
        persist_every=10**9,
        full_copy_every=1000,
        live_snapshot=True,
    )
    later.restore(toy.state)
    for step in range(1, 3):
        toy.step()
        later.save(step, toy.state)
    assert later.stats.live_saves >= 1


def test_without_the_memory_tier_with_it_off_or_for_a_small_state_every_save_copies(managers):
    cases = [
        (WIDTH, {"memory": False, "live_snapshot": True}),
        (WIDTH, {}),  # off by default (issue 33)
        (8, {"live_snapshot": True}),
    ]
    for i, (width, options) in enumerate(cases):
        toy = Toy(width=width)
        mgr = managers(managers.directory.parent / f"case{i}", **options)
        mgr.restore(toy.state)
        for step in range(1, 4):
            toy.step()
            mgr.save(step, toy.state)
        mgr.wait_snapshot()
        assert mgr.stats.live_saves == 0
        mgr.close(persist_last=False)


def test_a_parameter_that_shares_its_storage_stays_where_it_is():
    whole = torch.zeros(8)
    assert live.adoptable(torch.nn.Parameter(torch.zeros(4)))
    assert not live.adoptable(whole[:4])  # a view: the swap would leave `whole` behind
    assert not live.adoptable(torch.zeros(4, 4).t())  # not contiguous


@pytest.mark.parametrize(
    ("held_s", "gap_s", "every"),
    [
        (0.0, 1.0, 1),  # the copy hid in idle time: a full copy at every save
        (0.05, 0.9, 3),  # 0.05 s held against 2 % of 0.9 s
        (0.4, 0.02, live.MAX_FULL_COPY_EVERY),
        (0.05, 0.0, 1),  # no time per save known yet
    ],
)
def test_full_copies_are_as_far_apart_as_their_cost_asks(held_s, gap_s, every):
    assert live.full_copy_every(held_s, gap_s) == every
