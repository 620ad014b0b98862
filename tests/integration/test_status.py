"""`ftrun status` and `ftrun inspect` on a live job, a finished one, and one whose controller died."""

from __future__ import annotations

import signal

from tests.conftest import BIN, Output

SLEEPER = str(BIN / "sleeper.py")


def test_status_and_inspect_while_running_and_after(ftrun):
    proc = ftrun.start("launch", "--job-name", "live", SLEEPER)
    out = Output(proc)
    try:
        out.wait_for("[rank0]: step 2")
        [listed] = ftrun.status_json()
        assert (listed["name"], listed["state"], listed["generation"], listed["restarts"]) == (
            "live",
            "running",
            1,
            0,
        )
        one = ftrun.status_json(listed["job_id"][:8])  # a unique prefix is enough
        assert one["job_id"] == listed["job_id"] and one["incidents"] == []
        table = ftrun.run("status")
        assert (
            table.returncode == 0 and listed["job_id"] in table.stdout and "running" in table.stdout
        )
        inspect = ftrun.run("inspect", listed["job_id"])
        assert inspect.returncode == 0 and "generation 1 launched" in inspect.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)
    assert ftrun.status_json(listed["job_id"])["state"] == "stopped"
    inspect = ftrun.run("inspect", listed["job_id"], "--json")
    assert inspect.returncode == 0 and '"stop_requested"' in inspect.stdout


def test_inspect_shows_incident_phases(ftrun, tmp_path):
    marker = tmp_path / "once"
    result = ftrun.run(
        "launch",
        SLEEPER.replace("sleeper", "train_toy"),
        "--steps",
        "6",
        "--fail-at",
        "3",
        "--fail-once",
        str(marker),
    )
    assert result.returncode == 0, result.stderr
    job_id = ftrun.job_id()
    text = ftrun.run("inspect", job_id).stdout
    for phase in ("fault", "detected", "torn down", "relaunched", "first step again"):
        assert phase in text
    assert "incident 1: crash" in text and "restart-in-place" in text
