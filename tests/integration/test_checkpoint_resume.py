"""Exact resume under `ftrun launch`: a rank SIGKILLed mid-step, restart in place from the memory
tier, and the same losses, bit for bit, as a run that was never interrupted; `ftrun inspect`
shows the step restored, the tier and the steps lost."""

from __future__ import annotations

import json
import re
import shutil
from collections import defaultdict

import ftrun.checkpoint as ckpt
from ftrun.checkpoint import storage
from ftrun.controller import jobkey
from tests.conftest import BIN

TRAIN = str(BIN / "ckpt_train.py")
LOSS = re.compile(r"\[rank(\d)\]: LOSS rank=\d step=(\d+) loss=(\S+)")


def losses(stdout: str) -> dict[tuple[int, int], set[str]]:
    seen: dict[tuple[int, int], set[str]] = defaultdict(set)
    for rank, step, loss in LOSS.findall(stdout):
        seen[(int(rank), int(step))].add(loss)
    return seen


def checkpoint_lines(stdout: str) -> list[str]:
    """What ftrun.checkpoint and the fault injection said: why a restore took the step it did."""
    return [line for line in stdout.splitlines() if "ftrun-checkpoint" in line or "FAIL" in line]


def test_restart_in_place_restores_from_memory_and_resumes_exactly(ftrun, tmp_path):
    jobs: list[str] = []
    try:
        clean = ftrun.run("launch", "--nproc-per-node", "2", TRAIN, "--steps", "12", timeout=90)
        assert clean.returncode == 0, clean.stdout[-3000:] + clean.stderr[-3000:]
        jobs.append(ftrun.job_id())
        # Three slots (the default): the newest complete snapshot is never overwritten, even
        # while a persist holds one slot, so at most one step is lost (two slots: see
        # docs/checkpoint.md).
        faulted = ftrun.run(
            "launch",
            "--nproc-per-node",
            "2",
            TRAIN,
            "--steps",
            "12",
            "--fail-at",
            "7",
            "--fail-rank",
            "1",
            "--fail-once",
            str(tmp_path / "failed-once"),
            timeout=90,
        )
        out = faulted.stdout
        assert faulted.returncode == 0, out[-3000:] + faulted.stderr[-3000:]
        [job_id] = [j["job_id"] for j in ftrun.status_json() if j["job_id"] not in jobs]
        jobs.append(job_id)
        job = ftrun.status_json(job_id)
        # A second restart was seen once in a loaded CI run: its incidents say why.
        assert (job["state"], job["restarts"]) == ("succeeded", 1), (
            ftrun.run("inspect", job_id, "--json").stdout[-4000:] + out[-2000:]
        )

        assert "[rank1]: FAULT rank=1 step=7" in out
        restored = re.findall(
            r"\[rank(\d)\]: ftrun-checkpoint: restored step (\d+) from (\w+)", out
        )
        assert sorted(r for r, _, _ in restored) == ["0", "1"], out[-3000:]
        # Always (storage was seen ~1 run in 10 under the suite's load until rank 0, a step
        # ahead with a persist pinning a slot, waited for rank 1's copy instead of writing over
        # the last step both had completed: the next test forces that order). If it is not, the
        # output says why memory was skipped.
        assert {tier for _, _, tier in restored} == {"memory"}, out[-6000:]
        [step] = {int(s) for _, s, _ in restored}
        assert step in (5, 6), out[-6000:]  # the last snapshot every rank completed

        # `ftrun inspect` shows what the restart restored, from where, and what it cost.
        inspect = ftrun.run("inspect", job_id, "--json", timeout=30)
        assert inspect.returncode == 0, inspect.stderr
        [incident] = json.loads(inspect.stdout)["incidents"]
        assert (incident["restored_step"], incident["restored_tier"]) == (step, "memory")
        assert incident["step_at_fault"] >= 6
        assert incident["lost_steps"] == incident["step_at_fault"] - step
        human = ftrun.run("inspect", job_id, timeout=30).stdout
        assert f"restored: step {step} from memory; steps lost: {incident['lost_steps']}" in human

        want, got = losses(clean.stdout), losses(out)
        assert set(want) == {(r, s) for r in (0, 1) for s in range(1, 13)}
        assert set(got) == set(want)
        for key, values in got.items():
            assert values == want[key], f"rank {key[0]} step {key[1]}: {values} != {want[key]}"
        # After the restart each rank went on from the step after the restored one. (Whether
        # rank 0 printed step 7 before it was stopped too is a race with the fault's detection.)
        for rank in ("0", "1"):
            after = out.split(f"[rank{rank}]: ftrun-checkpoint: restored step {step}", 1)[1]
            assert [s for r, s, _ in LOSS.findall(after) if r == rank][0] == str(step + 1)

        # close() persisted the final step to storage, in the job directory by default.
        job_dir = ftrun.run_dir / job["job_id"]
        key = bytes.fromhex((job_dir / jobkey.KEY_FILE).read_text())  # the job's checkpoint key
        good, _ = storage.list_candidates(job_dir / "checkpoints", key=key)
        assert good and good[0].step == 12
    finally:  # a job's memory tier is the agent's to delete at job end; whatever it did, we do
        for job_dir in ftrun.run_dir.iterdir() if ftrun.run_dir.is_dir() else ():
            shutil.rmtree(ckpt.memory_tier_dir(job_dir.name), ignore_errors=True)


def test_a_rank_ahead_keeps_the_newest_step_every_rank_completed_while_a_persist_pins_a_slot(
    ftrun, tmp_path
):
    """What made the restart above restore step 1 from storage under load, forced: rank 0's
    first persist keeps one of its three slots pinned (a starved worker: 200 B/s here), rank 1's
    snapshot of step 6 is still uncommitted when rank 1 is killed in step 7 (held here), and
    rank 1 dies only once rank 0 has finished step 7, its save included, or 2 s later. Rank 0
    used to write step 7 over its step 5, the newest step both ranks had completed, and no step
    was in both tiers (nothing committed yet: step 0). Now its save of 7 waits for rank 1 to
    complete step 6 (host_progress.py), so rank 0 never finishes step 7 and both restore step 5
    from memory; the steps run again give the same losses, bit for bit."""
    record = tmp_path / "record"
    record.mkdir()
    try:
        run = ftrun.run(
            "launch", "--nproc-per-node", "2", TRAIN, "--steps", "12",
            "--fail-at", "7", "--fail-rank", "1", "--fail-once", str(tmp_path / "failed-once"),
            "--slow-persist-rank", "0", "--hold-snapshot", "6", "--fail-after-peers", "2",
            "--record", str(record), timeout=120,
        )  # fmt: skip
        out = run.stdout
        assert run.returncode == 0, out[-3000:] + run.stderr[-3000:]
        [job] = ftrun.status_json()
        assert (job["state"], job["restarts"]) == ("succeeded", 1), out[-3000:]
        assert "[rank1]: FAULT rank=1 step=7" in out
        restored = re.findall(
            r"\[rank(\d)\]: ftrun-checkpoint: restored step (\d+) from (\w+)", out
        )
        said = checkpoint_lines(out + run.stderr)
        assert sorted(restored) == [("0", "5", "memory"), ("1", "5", "memory")], said
        first = (record / "g1-r0.txt").read_text().split("\n")
        assert [line.split()[1] for line in first if line] == ["1", "2", "3", "4", "5", "6"]
        got = losses(out)
        assert set(got) == {(r, s) for r in (0, 1) for s in range(1, 13)}
        assert {key: v for key, v in got.items() if len(v) != 1} == {}  # 6 and 7 ran twice
    finally:
        for job in ftrun.status_json():
            shutil.rmtree(ckpt.memory_tier_dir(job["job_id"]), ignore_errors=True)


def test_ranks_agree_on_persists_by_votes_every_few_saves_not_at_every_save(ftrun):
    """Under ftrun every save could vote (a preemption notice may come); the votes run in the
    background, a few saves apart, and the ranks still persist the same saves."""
    try:
        run = ftrun.run(
            "launch", "--nproc-per-node", "2", TRAIN, "--steps", "80", "--step-time", "0.01",
            timeout=90,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        done = re.findall(
            r"DONE rank=(\d) persisted=(\d+) saves=(\d+) persists=(\d+) votes=(\d+)", run.stdout
        )
        assert sorted(rank for rank, *_ in done) == ["0", "1"], run.stdout[-3000:]
        [(persisted, saves, persists, votes)] = {tuple(map(int, d[1:])) for d in done}
        assert (persisted, saves) == (80, 80)  # close() persisted the last one
        assert persists >= 3  # the first save's, at least one voted in the background, close()'s
        assert votes <= saves // 3, f"{votes} votes for {saves} saves"
    finally:
        for job in ftrun.status_json():
            shutil.rmtree(ckpt.memory_tier_dir(job["job_id"]), ignore_errors=True)


def test_a_live_snapshot_restores_the_step_every_rank_saved_else_the_last_full_copy(
    ftrun, tmp_path
):
    """Two DDP ranks whose state (19 MiB each) lives in the memory tier's file, with a full copy
    every 4 saves (steps 1, 5, 9). Rank 1 killed after its forward pass at step 7: rank 0 waits
    in the all-reduce, both still hold step 6 live, and both restore it. Killed after its
    backward pass instead: once rank 0's optimizer step of 7 has changed its live file, they
    restore the last full copy both hold, step 5 (step 6 if rank 0 was torn down first).
    Exact either way."""
    common = [
        "launch", "--nproc-per-node", "2", TRAIN, "--steps", "10", "--width", "1280",
        "--full-copy-every", "4", "--persist-every", "1000", "--live-snapshot",
    ]  # fmt: skip
    try:
        clean = ftrun.run(*common, timeout=120)
        assert clean.returncode == 0, clean.stdout[-3000:] + clean.stderr[-3000:]
        want = losses(clean.stdout)
        assert set(want) == {(r, s) for r in (0, 1) for s in range(1, 11)}
        # Killed after its backward pass, rank 0 may still be torn down before its own optimizer
        # step of 7 runs (a loaded machine: seen in CI): its live file then still holds step 6,
        # and 6 is what both restore, exactly (the losses below).
        for where, allowed in (("forward", {6}), ("backward", {5, 6})):
            run = ftrun.run(
                *common, "--fail-at", "7", "--fail-rank", "1", "--fail-in", where,
                "--fail-once", str(tmp_path / f"failed-{where}"), timeout=120,
            )  # fmt: skip
            assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
            restored = re.findall(
                r"\[rank(\d)\]: ftrun-checkpoint: restored step (\d+) from (\w+)", run.stdout
            )
            [step] = {s for _, s, _ in restored}  # one step, the same on both ranks
            said = checkpoint_lines(run.stdout + run.stderr)
            # The live path may have been left, with a warning saying why (the memory tier
            # stepped down on a /dev/shm other tests fill): then step 6 was a copy still in
            # flight when rank 1 died, and the full copy of 5 is the exact restore.
            left_live = any("ftrun-checkpoint: warning" in line for line in said)
            assert int(step) in allowed | ({5} if left_live else set()), (where, restored, said)
            assert sorted(restored) == [("0", step, "memory"), ("1", step, "memory")]
            got = losses(run.stdout)
            assert set(got) == set(want)
            for key, values in got.items():
                assert values == want[key], f"{where}: rank {key[0]} step {key[1]}"
    finally:
        for job in ftrun.status_json():
            shutil.rmtree(ckpt.memory_tier_dir(job["job_id"]), ignore_errors=True)
