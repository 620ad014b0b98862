"""What a requeued run learns about why: the note an agent left in the Slurm job's Comment when
it requeued the job because the batch node, and the controller with it, was lost
(agent/slurm_requeue.py). The resumed controller journals that as the incident's fault
(`batch-node-lost`, detected when the agent lost the controller, torn down when the requeue
killed the old run), and clears the note so that a later run never reads it again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ftrun.agent.slurm_requeue import parse_note
from ftrun.slurmctl import SlurmError, job_fields, scontrol

log = logging.getLogger("ftrun.controller")

# A note written before the previous run's last journal event belongs to an earlier requeue
# (clocks of two nodes may differ this much: controller/host_checks.py warns past it).
CLOCK_SLACK_S = 2.0


@dataclass(frozen=True)
class BatchLoss:
    batch_host: str  # the lost node, where the previous controller ran
    by: str  # the node whose agent requeued the job
    lost_t: float  # when that agent lost the controller (its wall clock)
    requeued_t: float  # when it requeued the job (the old run's steps were killed)


def read(slurm_job_id: str, *, previous_last_t: float | None) -> BatchLoss | None:
    """The note of the requeue that started this run, if an agent left one; cleared."""
    try:
        comment = job_fields(slurm_job_id).get("Comment", "")
    except SlurmError as e:
        log.warning("cannot read Slurm job %s's comment: %s", slurm_job_id, e)
        return None
    note = parse_note(comment)
    if note is None:
        return None
    try:
        scontrol("update", f"jobid={slurm_job_id}", "Comment=")
    except SlurmError as e:
        log.warning("cannot clear Slurm job %s's comment: %s", slurm_job_id, e)
    try:
        loss = BatchLoss(note["batch"], note["by"], float(note["lost_at"]), float(note["at"]))
    except (KeyError, ValueError):
        return None
    if previous_last_t is not None and loss.requeued_t < previous_last_t - CLOCK_SLACK_S:
        return None  # an earlier requeue's note
    return loss
