"""The host's record of how far each rank has got (ftrun/checkpoint/host_progress.py), and the
rule it serves: a rank never writes over the newest step every rank of its host has completed.

The records are real files in a tier-like directory; the ranks' slots are the real slot table
(slot_table.py), driven as the Manager drives it (copy_path.py's make_room, save, commit). The
last tests replay, step by step, the restart that restored step 1 from storage in a loaded CI
run: the same save, once held back, leaves a step in both ranks' tiers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ftrun.checkpoint import host_progress
from ftrun.checkpoint.slot_table import SlotTable

RUN = "a1b2c3d4"  # the Manager's nonce: the same on every rank of one run


def rank_dir(tier: Path, rank: int) -> Path:
    path = tier / f"rank{rank}"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def test_each_rank_reads_every_record_of_its_run_on_the_host(tmp_path):
    r0, r1 = rank_dir(tmp_path, 0), rank_dir(tmp_path, 1)
    assert host_progress.steps(r0, run=RUN) == {}
    host_progress.publish(r0, run=RUN, step=7)
    host_progress.publish(r1, run=RUN, step=6)
    host_progress.publish(r1, run=RUN, step=8)  # replaced, not appended
    assert host_progress.steps(r0, run=RUN) == host_progress.steps(r1, run=RUN) == {0: 7, 1: 8}
    assert sorted(os.listdir(r1)) == ["progress"]  # no temp file left
    assert os.stat(r1 / "progress").st_mode & 0o777 == 0o600


def test_records_of_another_run_and_unreadable_ones_are_no_records(tmp_path):
    """A generation before this one (or an earlier run of the same job id) left its records; a
    record that is a link, a FIFO or garbage is passed over, never followed, never waited on."""
    mine = rank_dir(tmp_path, 0)
    host_progress.publish(rank_dir(tmp_path, 1), run="older", step=3)
    (rank_dir(tmp_path, 2) / "progress").write_bytes(b"\xff garbage")
    os.mkfifo(rank_dir(tmp_path, 3) / "progress")
    (rank_dir(tmp_path, 4) / "progress").symlink_to(mine / "progress")
    host_progress.publish(rank_dir(tmp_path / "replica", 5), run=RUN, step=1)  # not a rank here
    host_progress.publish(rank_dir(tmp_path, 6), run=RUN, step=2)
    (tmp_path / "rankX").mkdir()
    host_progress.publish(mine, run=RUN, step=4)
    assert host_progress.steps(mine, run=RUN) == {0: 4, 6: 2}
    assert host_progress.steps(None, run=RUN) == {}  # no tier: nothing to wait for


def test_a_withdrawn_or_unwritable_record_holds_nobody_back(tmp_path):
    r0, r1 = rank_dir(tmp_path, 0), rank_dir(tmp_path, 1)
    host_progress.publish(r1, run=RUN, step=3)
    host_progress.withdraw(r1)  # its copies left the tier
    assert host_progress.steps(r0, run=RUN) == {}
    host_progress.publish(r1, run=RUN, step=3)
    (r1 / f"progress.{os.getpid()}.tmp").mkdir()  # the new record cannot be made
    host_progress.publish(r1, run=RUN, step=4)
    assert host_progress.steps(r0, run=RUN) == {}  # no record rather than the old one


@pytest.mark.parametrize(
    ("done", "step", "behind"),
    [
        ({0: 6, 1: 6}, 5, []),  # both got past 5: it may go
        ({0: 6, 1: 5}, 5, [1]),  # rank 1's newest is 5 itself
        ({0: 6, 1: 4, 2: 5}, 5, [1, 2]),
        ({}, 5, []),  # no records: nobody to wait for
    ],
)
def test_behind_names_the_ranks_that_have_not_got_past_the_step(done, step, behind):
    assert host_progress.behind(done, step) == behind


class Rank:
    """One rank's slot table and its record, driven as its Manager drives them."""

    def __init__(self, tier: Path, rank: int, slots: int = 3) -> None:
        self.rank, self.directory = rank, rank_dir(tier, rank)
        self.table = SlotTable(slots)

    def waits_for(self) -> list[int]:
        """make_room(): the other ranks of the host the next save waits for."""
        step = self.table.overwrites()
        done = host_progress.steps(self.directory, run=RUN)
        done.pop(self.rank, None)
        return [] if step is None else host_progress.behind(done, step)

    def save(self, step: int, *, persist: bool = False) -> int:
        assert self.waits_for() == [], f"the save of step {step} is held back"
        return self.table.start_snapshot(persist=persist)

    def commit(self, index: int, step: int) -> None:
        self.table.filled(index, step)
        host_progress.publish(self.directory, run=RUN, step=step)

    def held(self) -> set[int]:
        return {s for i in range(len(self.table)) if (s := self.table.step(i)) is not None}


def test_a_rank_ahead_with_a_pinned_slot_waits_for_the_others_newest_step(tmp_path):
    """The loaded CI run, replayed: both ranks persist step 1, rank 1's worker is done at once,
    rank 0's is starved and keeps its slot pinned; in data parallel rank 0 can finish step 7
    while rank 1 still copies step 6. Rank 0's save of 7 would write over its step 5, the only
    step both hold: it waits until rank 1 has completed 6 (a kill meanwhile restores 5)."""
    r0, r1 = Rank(tmp_path, 0), Rank(tmp_path, 1)
    for r in (r0, r1):
        r.commit(r.save(1, persist=True), 1)
    r1.table.released()
    r1.table.persist_done()
    for step in range(2, 6):  # in step: neither waits
        for r in (r0, r1):
            r.commit(r.save(step), step)
    r0.commit(r0.save(6), 6)
    copying = r1.save(6)
    assert (r0.held(), r1.held()) == ({1, 5, 6}, {4, 5})
    assert r0.table.overwrites() == 5  # what the save of 7 wrote over before: no common step
    assert r0.waits_for() == [1]
    assert r0.held() & r1.held() == {5}  # a kill now: both restore 5
    r1.commit(copying, 6)
    r0.commit(r0.save(7), 7)
    assert (r0.held(), r1.held()) == ({1, 6, 7}, {4, 5, 6})
    assert r0.held() & r1.held() == {6}


@pytest.mark.parametrize("slots", [2, 3])
def test_a_rank_never_writes_over_the_step_another_rank_still_copies_after(tmp_path, slots):
    """Without a persist, three slots keep the newest step every rank completed without a wait
    (the rank behind is one copy behind at most); two wait where three do not."""
    r0, r1 = Rank(tmp_path, 0, slots), Rank(tmp_path, 1, slots)
    r0.commit(r0.save(1), 1)
    r1.commit(r1.save(1), 1)
    for step in range(2, 9):
        r0.commit(r0.save(step), step)
        copying = r1.save(step)  # rank 1's copy of `step` still runs
        assert max(r0.held() & r1.held()) == step - 1
        if slots == 3:
            assert r0.waits_for() == []  # the save of step + 1 writes over step - 2
        else:
            assert r0.waits_for() == [1]  # it would write over step - 1
        r1.commit(copying, step)
