"""A checkpoint that makes the job fail right after it is restored is rejected, not looped on:
under `ftrun launch`, the weights turn NaN at step 5 and step 5 is saved so; every generation
that restores step 5 fails at step 6 with the same error. The second such failure is a
`restore_rejected` incident (charged to the budget): the next generation is told to restore a
checkpoint older than step 5 (FTRUN_RESTORE_BEFORE), restores step 4, and finishes.
Without it the controller stops the job as 'the same failure twice' (or, with a bigger budget,
restarts into the same NaN until the budget is spent: Megatron-LM users saw 44 such loops)."""

from __future__ import annotations

import json

from tests.conftest import BIN

POISON = str(BIN / "ckpt_poison.py")


def test_a_job_failing_right_after_restoring_step_n_goes_back_one_more_commit(ftrun, tmp_path):
    run = ftrun.run(
        "launch",
        "--max-restarts",
        "5",
        POISON,
        "--steps",
        "8",
        "--poison-at",
        "5",
        "--once",
        str(tmp_path / "poisoned"),
        timeout=120,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    job_id = ftrun.job_id()
    events = ftrun.events(job_id)

    restored = [(e["gen"], e["step"]) for e in events if e["kind"] == "checkpoint_restored"]
    assert restored == [(1, 0), (2, 5), (3, 5), (4, 4)], restored
    [rejected] = [e for e in events if e["kind"] == "restore_rejected"]
    assert (rejected["step"], rejected["gen"], rejected["incident"]) == (5, 3, 3)
    classified = [e for e in events if e["kind"] == "fault_classified"]
    assert [e["rule"] for e in classified][-1] == "restore rejected"
    restarts = [e for e in events if e["kind"] == "restart"]
    assert len(restarts) == 3 and all(e["charged"] for e in restarts)  # charged to the budget
    # The fourth generation's ranks skipped step 5 and said why.
    [skipped] = [
        e["skipped"] for e in events if e["kind"] == "checkpoint_restored" and e["gen"] == 4
    ]
    assert any("restore_rejected" in why for why in skipped), skipped

    inspect = ftrun.run("inspect", job_id, "--json", timeout=30)
    assert inspect.returncode == 0, inspect.stderr
    incidents = json.loads(inspect.stdout)["incidents"]
    assert [i["restore_rejected"] for i in incidents] == [None, None, 5]
    human = ftrun.run("inspect", job_id, timeout=30).stdout
    assert "restore of step 5 rejected" in human, human[-3000:]
