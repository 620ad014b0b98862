"""A Slurm job whose batch node is lost goes back in the queue, from a node that survived.

Under Slurm the controller is the batch step, on the allocation's first node, which also
trains. When that node loses power, Slurm neither ends nor requeues a `--no-kill` job: it takes
the node out of the allocation and holds the others until the time limit (measured:
docs/slurm.md, "Losing the batch node"). Nobody is left to decide anything. So the agents do
the one thing that can be done from outside the batch step: requeue the job, which then starts
again as the same ftrun job and restores its newest committed checkpoint (as after a
preemption notice).

An agent that lost its controller without being told to stop (link.py `lose`), once it has
fenced its ranks, asks Slurm once a second: is the job still the run we were started in
(`Restarts`, so a later run is never requeued by mistake), and does Slurm hold the batch node
for gone (NOT_RESPONDING, DOWN, FAIL)? Only that evidence requeues: an agent cut off from a
controller whose node still answers Slurm was partitioned itself, and requeues nothing (the
controller replaces its host). It asks until slurmctld should have noticed a dead node
(SlurmdTimeout) and a margin more, then gives up. Every agent that lost the controller asks;
the first to see the evidence requeues, and the others then see a job that is no longer
RUNNING, or has a higher Restarts. The requeue kills every step of the run, a controller that
was only cut off included, so two controllers never run the job at once.

Before the requeue the agent writes what it saw into the job's Comment (`scontrol update`,
which the job's owner may do), so that the requeued controller can journal the incident with
its times (controller/requeue_note.py).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ftrun.slurmctl import SlurmError, job_fields, node_fields, requeue, scontrol

log = logging.getLogger("ftrun.agent")

POLL_S = 1.0
MARGIN_S = 30.0  # past SlurmdTimeout: slurmctld's pings and its marking the node DOWN
DEFAULT_SLURMD_TIMEOUT_S = 300.0  # Slurm's own default, when `scontrol show config` fails
# Words in a node's State (`IDLE+NOT_RESPONDING`, `DOWN*`, ...) that mean slurmctld cannot
# reach it; a node that is only draining or drained still answers.
GONE_WORDS = frozenset({"DOWN", "FAIL", "NOT_RESPONDING", "POWERED_DOWN", "POWERING_DOWN"})
COMMENT_PREFIX = "ftrun-requeue:"


@dataclass(frozen=True)
class Verdict:
    requeue: bool = False
    done: bool = False  # nothing left to wait for (requeued by another, or ended)
    why: str = ""


def node_gone(state: str) -> bool:
    """Whether a node's State says slurmctld holds it for unreachable."""
    words = [w.rstrip("*~#!%$@^-") for w in state.split("+")]
    return state.endswith("*") or any(w in GONE_WORDS for w in words)


def judge(job: Mapping[str, str], node_state: str | None, restarts: int) -> Verdict:
    """What Slurm's view of the job and of its batch node says to do (pure)."""
    state = job.get("JobState", "?")
    if state != "RUNNING":
        return Verdict(done=True, why=f"the job is {state}: not this agent's to requeue")
    run = int(job.get("Restarts") or 0)
    if run != restarts:
        return Verdict(done=True, why=f"the job was requeued already (run {run})")
    host = job.get("BatchHost") or "?"
    if node_state is not None and node_gone(node_state):
        return Verdict(
            requeue=True, why=f"Slurm holds the batch node {host} for gone ({node_state})"
        )
    return Verdict(why=f"the batch node {host} answers Slurm ({node_state or '?'})")


def slurmd_timeout_s(environ: Mapping[str, str] = os.environ) -> float:
    """SlurmdTimeout from `scontrol show config` (`SlurmdTimeout = 300 sec`)."""
    try:
        text = scontrol("show", "config", environ=environ)
    except SlurmError:
        return DEFAULT_SLURMD_TIMEOUT_S
    found = re.search(r"^SlurmdTimeout\s*=\s*(\d+)", text, re.MULTILINE)
    return float(found.group(1)) if found else DEFAULT_SLURMD_TIMEOUT_S


def requeue_if_batch_node_lost(
    job_id: str,
    restarts: int,
    *,
    host: str,
    lost_at: float,
    environ: Mapping[str, str] = os.environ,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Wait for Slurm's evidence that the batch node is gone, then requeue the job (True).
    `lost_at` is when this agent lost the controller (wall clock), `host` this agent's node."""
    deadline = clock() + slurmd_timeout_s(environ) + MARGIN_S
    said = ""
    while True:
        try:
            job = job_fields(job_id, environ=environ)
            batch = job.get("BatchHost")
            node_state = node_fields(batch, environ=environ).get("State") if batch else None
            verdict = judge(job, node_state, restarts)
        except (SlurmError, ValueError) as e:
            verdict = Verdict(why=f"cannot ask Slurm: {e}")
        if verdict.why != said:
            log.warning("lost the controller; Slurm job %s: %s", job_id, verdict.why)
            said = verdict.why
        if verdict.done:
            return False
        if verdict.requeue:
            return _requeue(job_id, job.get("BatchHost") or "?", host=host, lost_at=lost_at)
        if clock() >= deadline:
            log.warning("Slurm never held the batch node for gone: not requeuing job %s", job_id)
            return False
        sleep(POLL_S)


def _requeue(job_id: str, batch_host: str, *, host: str, lost_at: float) -> bool:
    note = (
        f"{COMMENT_PREFIX}batch={batch_host},by={host},lost_at={lost_at:.3f},at={time.time():.3f}"
    )
    try:  # what the requeued controller journals; the requeue matters more than the note
        scontrol("update", f"jobid={job_id}", f"Comment={note}")
    except SlurmError as e:
        log.warning("could not note the requeue in the job's Comment: %s", e)
    try:
        requeue(job_id)
    except SlurmError as e:  # another agent was first (the job is no longer running), or not ours
        log.warning("requeue of Slurm job %s refused: %s", job_id, e)
        return False
    log.warning("requeued Slurm job %s: its batch node %s is lost", job_id, batch_host)
    return True


def parse_note(comment: str) -> dict[str, str] | None:
    """The fields of an agent's note in a job's Comment (None: no note of ours)."""
    if not comment.startswith(COMMENT_PREFIX):
        return None
    pairs = (p.partition("=") for p in comment[len(COMMENT_PREFIX) :].split(","))
    return {k: v for k, sep, v in pairs if sep}
