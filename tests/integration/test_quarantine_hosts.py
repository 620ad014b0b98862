"""Quarantine outlives the job, on the ssh testbed: a host one job quarantined (its rank failed
there, with `[quarantine] failures = 1`) is kept in the user's store, and the next job over the
same hosts leaves it out from its start, saying why; cleared, it is used again."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import BIN, Ftrun
from tests.testbed import Testbed

TOY = str(BIN / "train_toy.py")


def launch(ftrun: Ftrun, bed: Testbed, tmp_path: Path, *extra: str):
    policy = tmp_path / "policy.toml"
    policy.write_text("[quarantine]\nfailures = 1\nwindow_s = 600\nexpiry_s = 3600\n")
    return ftrun.run(
        "launch", "--ssh-config", str(bed.ssh_config), "--hosts", "node1,node2,node3",
        "--min-nodes", "1", "--policy", str(policy), TOY, "--steps", "12",
        "--step-time", "0.05", *extra, timeout=240,
    )  # fmt: skip


def generations(ftrun: Ftrun, job: str) -> list[list[str]]:
    return [e["hosts"] for e in ftrun.events(job) if e["kind"] == "generation_launched"]


def test_a_host_quarantined_by_one_job_is_left_out_of_the_next(
    ftrun: Ftrun, testbed: Testbed, tmp_path: Path
) -> None:
    marker = tmp_path / "failed-once"
    first = launch(ftrun, testbed, tmp_path, "--fail-at", "5", "--fail-rank", "2",
                   "--fail-how", "exit", "--fail-once", str(marker))  # fmt: skip
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    [job1] = [j["job_id"] for j in ftrun.status_json()]
    # Its rank failed on node3: quarantined at once (failures = 1), the job shrank without it.
    assert generations(ftrun, job1) == [["node1", "node2", "node3"], ["node1", "node2"]]
    listed = ftrun.run("hosts", "--quarantined")
    assert listed.returncode == 0 and "node3" in listed.stdout, listed.stderr
    assert f"(job {job1})" in listed.stdout and "rank 2 on node3" in listed.stdout

    second = launch(ftrun, testbed, tmp_path)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    [job2] = [j["job_id"] for j in ftrun.status_json() if j["job_id"] != job1]
    assert generations(ftrun, job2) == [["node1", "node2"]]
    assert "node3 is quarantined until" in second.stderr + second.stdout
    [kept] = [e for e in ftrun.events(job2) if e["kind"] == "host_quarantined"]
    assert kept["host"] == "node3" and kept["from_store"] is True

    cleared = ftrun.run("hosts", "--quarantined", "--clear", "node3")
    assert cleared.returncode == 0, cleared.stderr
    third = launch(ftrun, testbed, tmp_path)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    [job3] = [j["job_id"] for j in ftrun.status_json() if j["job_id"] not in (job1, job2)]
    assert generations(ftrun, job3) == [["node1", "node2", "node3"]]
