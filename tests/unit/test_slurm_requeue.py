"""The agent's verdict on a lost controller under Slurm (agent/slurm_requeue.py): requeue only on
Slurm's evidence that the batch node is gone, never a later run, never a job that ended; and the
note it leaves for the requeued controller (controller/requeue_note.py)."""

from __future__ import annotations

import pytest

from ftrun.agent.slurm_requeue import COMMENT_PREFIX, judge, node_gone, parse_note


@pytest.mark.parametrize(
    "state, gone",
    [
        ("IDLE+NOT_RESPONDING", True),
        ("DOWN+NOT_RESPONDING", True),
        ("DOWN", True),
        ("ALLOCATED*", True),
        ("MIXED+FAIL", True),
        ("IDLE+POWERED_DOWN", True),
        ("ALLOCATED", False),
        ("MIXED+DRAIN", False),  # draining still answers
        ("IDLE+COMPLETING", False),
    ],
)
def test_a_node_is_gone_only_when_slurm_cannot_reach_it(state: str, gone: bool) -> None:
    assert node_gone(state) is gone


JOB = {"JobState": "RUNNING", "Restarts": "2", "BatchHost": "node1"}


def test_the_batch_node_held_for_gone_requeues_the_run_we_were_started_in() -> None:
    verdict = judge(JOB, "DOWN+NOT_RESPONDING", restarts=2)
    assert verdict.requeue and not verdict.done
    assert "node1" in verdict.why


def test_a_batch_node_that_answers_means_we_were_cut_off_ourselves_so_we_wait() -> None:
    verdict = judge(JOB, "ALLOCATED", restarts=2)
    assert not verdict.requeue and not verdict.done
    assert "answers" in verdict.why


def test_a_later_run_or_an_ended_job_is_never_requeued() -> None:
    later = judge(JOB, "DOWN", restarts=1)  # another agent requeued already: run 2 is not ours
    assert later.done and not later.requeue
    for state in ("COMPLETING", "PENDING", "CANCELLED", "TIMEOUT", "COMPLETED"):
        ended = judge({**JOB, "JobState": state}, "DOWN", restarts=2)
        assert ended.done and not ended.requeue, state


def test_the_note_reads_back_and_other_comments_are_not_ours() -> None:
    note = f"{COMMENT_PREFIX}batch=node1,by=node3,lost_at=100.5,at=108.25"
    assert parse_note(note) == {"batch": "node1", "by": "node3", "lost_at": "100.5", "at": "108.25"}
    assert parse_note("(null)") is None
    assert parse_note("") is None
    assert parse_note("a user's own comment") is None
