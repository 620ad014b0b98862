"""The Slurm batch node's power loss does not end the job (issue 36, item 3): the node that runs
the controller is powered off mid-run; an agent on a surviving node sees Slurm hold it for gone
and requeues the job (agent/slurm_requeue.py); the requeued run resumes the same ftrun job from
its newest committed checkpoint, on the nodes Slurm gives it, and finishes with the losses of a
run that was never interrupted. No person acts. On the shared 4-node bed: 2 training nodes and a
spare, so the requeued run has 3 nodes to go to once node1 is gone."""

from __future__ import annotations

import json

import pytest

from tests.conftest import BIN, Ftrun, wait_for
from tests.integration.test_slurm import evidence, kinds, losses, output, reached, submit
from tests.slurmbed import SlurmBed

TRAIN = str(BIN / "ckpt_train.py")
PERSIST_EVERY = 5


# Slurm's own waits (about 15 s to mark the node down) come on top of two jobs: 57 s once under
# load, and once past the suite's 120 s; the test's own waits allow 180 s.
@pytest.mark.timeout(240)
def test_the_batch_nodes_power_loss_requeues_the_job_which_resumes_and_finishes(
    ftrun: Ftrun, slurm: SlurmBed
) -> None:
    steps = ["--steps", "40", "--persist-every", str(PERSIST_EVERY)]
    reference = ftrun.run("launch", "--nproc-per-node", "2", TRAIN, *steps, timeout=120)
    assert reference.returncode == 0, reference.stderr
    job = submit(
        ftrun, slurm, "--nodes", "2", "--spares", "1", "--nproc-per-node", "1", "--",
        TRAIN, *steps, "--step-time", "0.1",
    )  # fmt: skip
    try:
        wait_for(lambda: reached(job, 12), 120, "step 12")
        slurm.kill_node("node1")  # the batch node: the controller, its sruns, an agent, a rank
        info = slurm.wait_state(job["slurm_job_id"], "COMPLETED", timeout_s=180)
    except Exception as e:  # what tells an ftrun fault from a Slurm one, kept with the failure
        raise AssertionError(f"{e}\n{evidence(job, slurm)}") from e
    assert info["Restarts"] == "1", info
    assert "node1" not in info["NodeList"], info
    fault = next(f for f in kinds(job, "fault_detected") if f["fault"] == "batch-node-lost")
    assert fault["host"] == "node1"
    assert "requeued the Slurm job" in fault["reason"]
    # The first run never finished (its controller was powered off); the requeued one did.
    assert [f["state"] for f in kinds(job, "job_finished")] == ["succeeded"]
    restored = kinds(job, "checkpoint_restored")
    assert restored, output(job)
    assert fault["step"] - restored[-1]["step"] <= PERSIST_EVERY + 1, (fault, restored[-1])
    assert losses(output(job)) == losses(reference.stdout + reference.stderr)
    shown = ftrun.run("inspect", job["job_id"], "--json", env=slurm.env)
    assert shown.returncode == 0, shown.stderr
    incident = next(
        i for i in json.loads(shown.stdout)["incidents"] if i["kind"] == "batch-node-lost"
    )
    phases = incident["phases"]
    assert None not in phases.values(), phases
    order = [
        phases[p] for p in ("fault", "detected", "torn down", "relaunched", "first step again")
    ]
    assert order == sorted(order), phases
    print(f"batch node lost → first step again: {incident['recovered_s']} s; phases {phases}")
