"""Fault detection with real ranks: hangs (with stacks), zero-code progress, sections, start-up
allowance, lost hosts, and the policy file."""

from __future__ import annotations

import signal

import pytest

from ftrun.agent.stacks import py_spy
from tests.conftest import BIN, Output, wait_for

TOY = str(BIN / "train_toy.py")


def chaos(ftrun, job_id, *args):
    result = ftrun.run("chaos", job_id, *args, timeout=30)
    assert result.returncode == 0, result.stderr
    return result


def running_job(ftrun) -> str:
    return ftrun.job_id(30)


def test_hung_rank_is_detected_with_stacks_and_restarted(ftrun, tmp_path):
    proc = ftrun.start(
        "launch",
        "--nproc-per-node",
        "2",
        "--hang-floor",
        "1",
        TOY,
        "--steps",
        "150",
        "--step-time",
        "0.02",
        "--ckpt-dir",
        str(tmp_path),
    )
    out = Output(proc)
    out.wait_for("[rank1]: STEP 10 ")
    job_id = running_job(ftrun)
    chaos(ftrun, job_id, "hang-rank", "--rank", "1")
    assert proc.wait(timeout=90) == 0, out.text()
    job = ftrun.status_json(job_id)
    [inc] = job["incidents"]
    assert (inc["kind"], inc["tier"], inc["rank"], inc["injected"]) == (
        "hang",
        "restart-in-place",
        1,
        "hang-rank",
    )
    assert inc["allowance_s"] >= 1.0 and 0 <= inc["past_allowance_s"] <= 2.0
    assert inc["states"]["1"] == "stopped"
    # Rank 0 was blocked in a collective, waiting for rank 1: its own faulthandler dump says where.
    assert "most recent call first" in inc["stacks"]["0"] and "train_toy.py" in inc["stacks"]["0"]
    if py_spy():
        assert "py-spy dump" in inc["stacks"]["1"] and "train_toy.py" in inc["stacks"]["1"]
    assert job["state"] == "succeeded" and job["restarts"] == 1


def test_progress_regex_detects_a_hang_in_a_script_that_knows_nothing_of_ftrun(ftrun, tmp_path):
    result = ftrun.run(
        "launch",
        "--progress-regex",
        r"^step (\d+)",
        "--hang-floor",
        "1",
        str(BIN / "plain_loop.py"),
        "--steps",
        "60",
        "--stop-at",
        "20",
        "--marker",
        str(tmp_path / "stopped"),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    job = ftrun.only_job()
    [inc] = job["incidents"]
    assert inc["kind"] == "hang" and inc["rank"] == 0 and inc["step_at_fault"] >= 19
    assert inc["past_allowance_s"] <= 2.0


def test_declared_sections_are_not_hangs(ftrun):
    result = ftrun.run("launch", "--hang-floor", "2", str(BIN / "sections.py"), "--section-s", "4")
    assert result.returncode == 0, result.stderr
    assert ftrun.only_job()["incidents"] == []


def test_a_section_past_its_own_allowance_is_a_hang(ftrun):
    result = ftrun.run(
        "launch",
        "--max-restarts",
        "0",
        str(BIN / "sections.py"),
        "--section-s",
        "30",
        "--section-timeout",
        "1",
    )
    assert result.returncode == 1
    [inc] = ftrun.only_job()["incidents"]
    assert inc["kind"] == "hang" and inc["section"] == "checkpoint" and inc["allowance_s"] == 1.0


def test_startup_allowance_then_same_hang_twice_is_fatal(ftrun):
    result = ftrun.run(
        "launch", "--startup-timeout", "1", str(BIN / "plain_loop.py"), "--pre-sleep", "60"
    )
    assert result.returncode == 1
    job = ftrun.only_job()
    assert [i["kind"] for i in job["incidents"]] == ["hang", "hang"]
    assert job["incidents"][1]["tier"] == "fatal" and "same failure twice" in job["reason"]


# freeze-agent is not here: on this machine a frozen (SIGSTOPped) agent is alive, so it is slow,
# not lost (tests/integration/test_false_alarms.py); over ssh it is a lost host.
@pytest.mark.parametrize("action, bound_s", [("kill-agent", 1.5)])
def test_lost_host_is_detected_fast_and_needs_replacement(ftrun, tmp_path, action, bound_s):
    proc = ftrun.start("launch", "--nproc-per-node", "2", str(BIN / "sleeper.py"))
    out = Output(proc)
    out.wait_for("[rank1]: step 3")
    job_id = running_job(ftrun)
    chaos(ftrun, job_id, action)
    assert proc.wait(timeout=30) == 1
    job = ftrun.status_json(job_id)
    [inc] = job["incidents"]
    assert (inc["kind"], inc["host"], inc["injected"]) == ("host-lost", "localhost", action)
    assert inc["detected_s"] is not None and inc["detected_s"] <= bound_s
    assert "no spare host" in job["reason"]


def test_policy_file_rules_and_quarantine(ftrun, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text('[[rules]]\nname = "exit 7 is bad data"\nexit_codes = [7]\ntier = "fatal"\n')
    result = ftrun.run(
        "launch", "--policy", str(policy), TOY, "--fail-at", "2", "--fail-how", "exit"
    )
    assert result.returncode == 1 and "exit 7 is bad data" in result.stderr
    assert ftrun.only_job()["incidents"][0]["rule"] == "exit 7 is bad data"


def test_repeated_failures_quarantine_the_host(ftrun, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text("[quarantine]\nfailures = 2\nwindow_s = 600\n")
    proc = ftrun.start(
        "launch", "--policy", str(policy), "--max-restarts", "5", str(BIN / "sleeper.py")
    )
    out = Output(proc)
    out.wait_for("[rank0]: step 2")
    job_id = running_job(ftrun)
    chaos(ftrun, job_id, "kill-rank", "--rank", "0", "--at-step", "5")
    wait_for(
        lambda: any(
            e["kind"] == "generation_launched" and e["gen"] == 2 for e in ftrun.events(job_id)
        ),
        30,
        "generation 2",
    )
    # A later step than the first failure: progress in between, so only the quarantine stops it.
    # The first kill lands where the rank was when chaos reached it (past step 5 on a busy
    # machine), and the restarted script counts from 1 again: the second is placed past it.
    [first] = [e["step"] for e in ftrun.events(job_id) if e["kind"] == "fault_detected"]
    later = str(first + 5)
    wait_for(
        lambda: (
            ftrun.run(
                "chaos", job_id, "kill-rank", "--rank", "0", "--at-step", later, timeout=30
            ).returncode
            == 0
        ),
        30,
        "generation 2 to accept chaos",
    )
    assert proc.wait(timeout=30) == 1
    job = ftrun.status_json(job_id)
    assert "quarantined" in job["reason"] and "no spare host" in job["reason"]
    # Classified replace-node; with no other host to take its place, the job ends.
    assert [i["tier"] for i in job["incidents"]] == ["restart-in-place", "replace-node"]
    assert job["state"] == "failed"
    assert any(e["kind"] == "host_quarantined" for e in ftrun.events(job_id))


def test_bad_policy_file_and_chaos_input(ftrun, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text("[[rules]]\ntier = 'sometimes'\n")
    result = ftrun.run("launch", "--policy", str(policy), TOY)
    assert result.returncode == 2 and "tier must be one of" in result.stderr
    assert "Traceback" not in result.stderr
    result = ftrun.run("chaos", "nope", "kill-rank")
    assert result.returncode == 2 and "no job" in result.stderr
    result = ftrun.run("chaos", "nope", "explode")
    assert result.returncode == 2 and "unknown chaos action" in result.stderr


def test_a_warm_rank_finalizing_after_its_last_step_is_not_a_hang(ftrun):
    """The warm start tells the agent when the script's code has returned; the seconds the
    interpreter then takes to finalize are not measured against the step allowance."""
    result = ftrun.run(
        "launch", "--progress-regex", r"^step (\d+)", "--hang-floor", "1", str(BIN / "slow_exit.py")
    )
    assert result.returncode == 0, result.stdout + result.stderr
    job = ftrun.only_job()
    assert job["incidents"] == [] and job["generation"] == 1


def test_at_step_counts_the_jobs_step_when_the_named_rank_reports_none(ftrun):
    """Only rank 0 prints the line --progress-regex reads (as a script logging from rank 0
    does): "kill rank 1 at step 40" must still happen, at the job's step 40."""
    proc = ftrun.start(
        "launch", "--nproc-per-node", "2", "--progress-regex", r"^step (\d+)$",
        str(BIN / "plain_loop.py"), "--steps", "150", "--interval", "0.05", "--print-rank", "0",
    )  # fmt: skip
    out = Output(proc)
    out.wait_for("[rank0]: step 3")
    job_id = running_job(ftrun)
    chaos(ftrun, job_id, "kill-rank", "--rank", "1", "--at-step", "40")
    assert proc.wait(timeout=60) == 0, out.text()
    events = ftrun.events(job_id)
    [fault] = [e for e in events if e["kind"] == "fault_detected"]
    assert (fault["rank"], fault["signal"], fault.get("injected")) == (1, "SIGKILL", "kill-rank")
    assert fault["step"] >= 40, fault


def test_chaos_input_the_controller_refuses_is_answered_not_left_to_time_out(ftrun):
    proc = ftrun.start("launch", str(BIN / "sleeper.py"))
    out = Output(proc)
    try:
        out.wait_for("[rank0]: step 2")
        job_id = running_job(ftrun)
        result = ftrun.run("chaos", job_id, "kill-rank", "--rank", "0", "--at-step", "-5")
        assert result.returncode == 2 and "greater than or equal to 0" in result.stderr
        # Past what the message's schema allows: the controller says why, at once.
        result = ftrun.run("chaos", job_id, "kill-agent", "--host", "h" * 5000, timeout=8)
        assert result.returncode == 2, result.stderr
        assert "refused the request" in result.stderr and "over 512" in result.stderr
        assert "Traceback" not in result.stderr
        assert ftrun.status_json(job_id)["generation"] == 1  # nothing happened to the job
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


@pytest.mark.parametrize("start", ["--warm-start", "--cold-start"])
def test_a_final_save_on_rank_0_while_the_others_wait_is_not_a_hang(ftrun, start):
    """After its last step rank 0 saves for 3 s (CPU busy) while rank 1 waits in barrier()
    past its 1 s allowance: rank 1 is waiting for a peer that computes, not hung, and the
    finished job is not restarted (it was, when one long interval was a verdict)."""
    result = ftrun.run(
        "launch",
        start,
        "--nproc-per-node",
        "2",
        "--progress-regex",
        r"^step (\d+)$",
        "--hang-floor",
        "1",
        str(BIN.parent / "conformance" / "final_save.py"),
        "--save-s",
        "3",
        env={"CONF_DIR": str(ftrun.run_dir.parent)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    job = ftrun.only_job()
    assert job["incidents"] == [] and job["generation"] == 1


def test_every_rank_stuck_in_teardown_is_not_restarted(ftrun):
    """Every rank waits forever in its teardown after the last step: the stacks show it, so
    the exit barrier rules (its own timeout, then killed, the work done) instead of a restart
    that would train again."""
    result = ftrun.run(
        "launch",
        "--nproc-per-node",
        "2",
        "--progress-regex",
        r"^step (\d+)$",
        "--hang-floor",
        "1",
        "--exit-timeout",
        "3",
        str(BIN / "stuck_teardown.py"),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    job = ftrun.only_job()
    assert job["generation"] == 1, job["incidents"]
    kinds = [e["kind"] for e in ftrun.events(job["job_id"])]
    assert "teardown_seen" in kinds and "fault_classified" in kinds
    [fault] = [e for e in ftrun.events(job["job_id"]) if e["kind"] == "fault_detected"]
    assert fault["fault"] == "exit_hang", fault
