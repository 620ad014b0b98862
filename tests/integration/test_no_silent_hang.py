"""No silent hang with real ranks: the exit barrier (a rank exited 0, another does not exit) and
the zero-config idle guard (no progress signal, no CPU, no output)."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import BIN

EXIT_HANG = str(BIN / "exit_hang.py")
SILENT = str(BIN / "silent.py")


def inspect_json(ftrun, job_id):
    result = ftrun.run("inspect", job_id, "--json", timeout=30)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("start", ["--warm-start", "--cold-start"])
def test_rank_that_does_not_exit_after_another_exited_0(ftrun, start):
    """Rank 0 exits 0 after the work; rank 1 waits forever. Past --exit-timeout its stacks are
    taken, it is killed, and the job ends: succeeded (exit 0), with an exit_hang incident.
    Cold start: the script never imports ftrun, so it has no stack-dump handler, and must not
    be killed by the signal that asks for one (py-spy reads its stacks, where installed)."""
    result = ftrun.run(
        "launch", start, "--nproc-per-node", "2", "--exit-timeout", "2", EXIT_HANG, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "did not exit within 2 s" in result.stderr
    job = inspect_json(ftrun, ftrun.status_json()[0]["job_id"])
    assert job["state"] == "succeeded" and job["exit_code"] == 0 and job["restarts"] == 0
    [inc] = job["incidents"]
    assert (inc["kind"], inc["tier"], inc["rank"], inc["clean_rank"]) == (
        "exit_hang",
        "finish",
        1,
        0,
    )
    assert inc["allowance_s"] == 2.0 and inc["past_allowance_s"] >= 0
    assert set(inc["stacks"]) == {"1"} and inc["states"]["1"] in ("sleeping", "disk-sleep")
    if start == "--warm-start":  # the warm interpreter registered faulthandler
        assert "most recent call first" in inc["stacks"]["1"]
    if start == "--warm-start" or shutil.which("py-spy"):
        assert "exit_hang.py" in inc["stacks"]["1"] and "wait" in inc["stacks"]["1"]
    kinds = [e["kind"] for e in job["events"]]
    assert (
        kinds.index("exit_barrier")
        < kinds.index("stacks_requested")
        < kinds.index("fault_detected")
    )
    [barrier] = [e for e in job["events"] if e["kind"] == "exit_barrier"]
    [asked] = [e for e in job["events"] if e["kind"] == "stacks_requested"]
    # The barrier is timed on the controller's monotonic clock from just before its event is
    # stamped with the wall clock: the two stamps may read up to a few ms under 2 s (1.9985 in CI).
    assert 2.0 - 0.05 <= asked["t"] - barrier["t"] < 4.0
    assert job["generations"][0]["outcome"] == "exit_hang"


def test_rank_that_fails_after_another_exited_0_is_not_restarted(ftrun):
    """The work is done (rank 0 exited 0); rank 1 then exits 3: the job failed, exit 1, and the
    generation is not run again."""
    result = ftrun.run(
        "launch",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "3",
        EXIT_HANG,
        "--then",
        "fail",
        timeout=120,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    job = ftrun.only_job()
    assert job["state"] == "failed" and job["restarts"] == 0 and job["generation"] == 1
    [inc] = job["incidents"]
    assert (inc["kind"], inc["rank"], inc["exit_code"], inc["tier"], inc["rule"]) == (
        "crash",
        1,
        3,
        "fatal",
        "work done",
    )
    assert "after rank 0 had exited 0" in job["reason"]


def test_silent_idle_ranks_are_a_hang_restarted_then_fatal(ftrun):
    """Both ranks sleep without a word and without a progress signal: after --idle-timeout the
    idle guard takes their stacks and reports a hang; restarted in place once, then the same
    hang again is fatal."""
    result = ftrun.run(
        "launch", "--nproc-per-node", "2", "--idle-timeout", "2", SILENT, timeout=120
    )
    assert result.returncode == 1, result.stdout + result.stderr
    job = inspect_json(ftrun, ftrun.status_json()[0]["job_id"])
    assert [i["kind"] for i in job["incidents"]] == ["hang", "hang"]
    assert [i["tier"] for i in job["incidents"]] == ["restart-in-place", "fatal"]
    assert "same failure twice" in job["reason"] and "idle: no CPU and no output" in job["reason"]
    for inc in job["incidents"]:
        assert inc["rank"] == 0 and 2.0 <= inc["idle_s"] < 10.0
        assert set(inc["stacks"]) == {"0", "1"}
        # Where each one sits: faulthandler's dump (and py-spy's, where installed).
        assert all(
            "most recent call first" in text and "silent.py" in text
            for text in inc["stacks"].values()
        )
    asked = [e for e in job["events"] if e["kind"] == "stacks_requested"]
    assert [e["why"] for e in asked] == ["idle", "idle"]


def test_a_busy_silent_rank_is_not_idle(ftrun):
    """Rank 0 burns CPU without a word for 4 s, well past the 1 s window, while rank 1 sleeps:
    not every rank is idle, so nothing is flagged."""
    result = ftrun.run(
        "launch",
        "--nproc-per-node",
        "2",
        "--idle-timeout",
        "1",
        SILENT,
        "--mode",
        "spin",
        "--seconds",
        "4",
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    job = ftrun.only_job()
    assert job["incidents"] == [] and job["state"] == "succeeded"


@pytest.mark.parametrize("mode", ["section", "steps"])
def test_declared_sections_and_stepping_ranks_are_not_idle(ftrun, mode):
    """Silent and without CPU, but inside ftrun.section (a pause on purpose), or calling
    ftrun.step every 1.5 s (the step-based detector watches them): never idle, though either
    would look idle to a 0.5 s window."""
    result = ftrun.run(
        "launch",
        "--nproc-per-node",
        "2",
        "--idle-timeout",
        "0.5",
        SILENT,
        "--mode",
        mode,
        "--seconds",
        "4",
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    job = ftrun.only_job()
    assert job["incidents"] == [] and job["state"] == "succeeded"
