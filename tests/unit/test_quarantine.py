"""The user's quarantine store (ftrun/quarantine.py): kept across jobs, written whole under a
lock by jobs at once, the user's alone, never a reason for a job not to start; and the job
machine's side of it (a quarantine it decides is told, one from the store is left out)."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from ftrun.cli.batch_script import BatchScript
from ftrun.quarantine import Entry, QuarantineStore, StoreError, store_path
from tests.unit.test_job import Clock, lose, machine


def entry(host: str, until_t: float, transport: str = "ssh") -> Entry:
    return Entry(host=host, until_t=until_t, reason="3 failures within 600 s", failures=3,
                 job="train-1a2b3c", transport=transport, since_t=until_t - 3600)  # fmt: skip


def test_entries_last_until_they_expire_and_clear_lets_a_host_back(tmp_path: Path) -> None:
    store = QuarantineStore(tmp_path / "state" / "quarantine.json")
    now = time.time()
    store.add(entry("node2", now + 3600))
    store.add(entry("node3", now + 60))
    store.add(entry("node2", now + 10))  # a shorter one does not shorten it
    assert [(e.host, e.until_t) for e in store.active()] == [("node3", now + 60),
                                                              ("node2", now + 3600)]  # fmt: skip
    assert [e.host for e in store.active(now_t=now + 61)] == ["node2"]  # node3 expired
    assert store.clear(["node3", "node9"]) == ["node3"]
    assert [e.host for e in store.active()] == ["node2"]
    assert store.clear(["all"]) == ["node2"] and store.active() == []
    assert os.stat(store.path).st_mode & 0o777 == 0o600
    assert os.stat(store.path.parent).st_mode & 0o777 == 0o700


def _add_many(path: str, prefix: str, n: int) -> None:
    store = QuarantineStore(Path(path))
    for i in range(n):
        store.add(entry(f"{prefix}{i}", time.time() + 3600))


def test_jobs_writing_at_once_lose_no_entry(tmp_path: Path) -> None:
    path = str(tmp_path / "quarantine.json")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_add_many, args=(path, p, 20)) for p in ("a", "b", "c")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    hosts = {e.host for e in QuarantineStore(Path(path)).active()}
    assert hosts == {f"{p}{i}" for p in "abc" for i in range(20)}


def test_a_broken_store_is_said_never_stops_a_launch_and_clear_all_starts_afresh(
    tmp_path: Path,
) -> None:
    store = QuarantineStore(tmp_path / "quarantine.json")
    store.path.write_text("{not json")
    store.path.chmod(0o600)
    known, problem = store.load()
    assert known == {} and problem is not None and "is not one ftrun wrote" in problem
    with pytest.raises(StoreError):
        store.add(entry("node2", time.time() + 60))  # nothing of the broken file is lost
    assert store.path.read_text() == "{not json"
    assert store.clear(["all"]) == [] and store.active() == []
    # Another user could have written it: refused, not read.
    store.add(entry("node2", time.time() + 60))
    store.path.chmod(0o666)
    _, problem = store.load()
    assert problem is not None and "group or other users can write to it" in problem
    store.path.chmod(0o600)
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"version": 1, "hosts": {}}))
    store.path.unlink()
    store.path.symlink_to(target)
    _, problem = store.load()
    assert problem is not None and "cannot read" in problem


def test_the_store_is_state_under_xdg_or_where_the_environment_says() -> None:
    assert store_path({"XDG_STATE_HOME": "/s"}) == Path("/s/ftrun/quarantine.json")
    assert store_path({"FTRUN_QUARANTINE_FILE": "/q.json", "XDG_STATE_HOME": "/s"}) == Path(
        "/q.json"
    )


def test_the_job_machine_tells_each_quarantine_and_leaves_out_one_from_the_store(
    tmp_path: Path,
) -> None:
    clock = Clock()
    told: list[tuple[str, float, str, int]] = []
    job = machine(tmp_path, clock)
    job.quarantined = lambda *args: told.append(args)
    for host in ("node1", "node2", "node3"):
        job.roster.ready(job.roster.new_agent(host))
    job.bench("node3", until_t=clock.t + 100.0, why="from another job")
    hosts = job.first_plan()
    assert hosts == ["node1", "node2"]  # node3 left out while it lasts
    job.launch(hosts)
    for _ in range(3):
        job.roster.add("node2")
        job.roster.ready(job.roster.new_agent("node2"))
        lose(job, ["node1", "node2"], "node2", None)
    [(host, until_t, why, failures)] = told  # once: when the third failure benched it
    assert host == "node2" and failures == 3 and until_t == pytest.approx(clock.t + 3600.0)
    assert why == "3 failures within 600 s, the last: host node2 was lost"
    clock.t += 101.0
    assert "node3" in job.plan("test")  # the store's quarantine expired


def test_sbatch_excludes_the_quarantined_nodes_ahead_of_the_users_own_options() -> None:
    batch = BatchScript(job_id="t-1", job_name="t", run_dir=Path("/r"), cwd="/w",
                        python="/usr/bin/python3", script="train.py", nodes=2,
                        exclude=("node2", "node7"), sbatch_args=("--exclude=node9",))  # fmt: skip
    text = batch.render()
    assert "#SBATCH --exclude=node2,node7" in text
    assert text.index("--exclude=node2,node7") < text.index("--exclude=node9")
    hostile = BatchScript(job_id="t-1", job_name="t", run_dir=Path("/r"), cwd="/w",
                          python="/p", script="t.py", exclude=("node2\nrm -rf ~",))  # fmt: skip
    assert hostile.line_breakers() == ["the quarantine store's nodes"]
