"""`python -m ftrun.agent`: reads its Bootstrap as one JSON line on stdin, then runs."""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from ftrun import terms
from ftrun.agent import copy_tunables, slurm_requeue
from ftrun.agent.agent import Agent
from ftrun.bootstrap import Bootstrap
from ftrun.errors import EXIT_SUPERSEDED


def main() -> int:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s agent %(levelname)s %(message)s"
    )
    line = sys.stdin.buffer.readline()
    try:
        boot = Bootstrap.from_json(line.decode())
    except (ValueError, TypeError) as e:
        print(f"ftrun agent: bad bootstrap on stdin: {e}", file=sys.stderr)
        return 2
    # Before anything is started or written: the zygote, torchrun and the ranks inherit the
    # umask (what they write is 0600/0700, or 0640/0750 with --group-readable), and the
    # environment the launcher forwards.
    os.umask(boot.umask)
    os.environ.update(boot.env)
    if tunables := copy_tunables.apply(os.environ):
        logging.info("ranks start with GLIBC_TUNABLES=%s (copy_tunables.py)", tunables)
    if terms.superseded(boot.job_id, boot.term):  # started by a controller cut off, then back
        logging.error(
            "a newer controller than term %d leads this job here: not starting", boot.term
        )
        return EXIT_SUPERSEDED
    agent = Agent(boot)
    code = asyncio.run(agent.run())
    if boot.slurm_requeue_job and agent.lost_controller is not None:
        # Its ranks are stopped; if the controller's node is what was lost, the job goes back
        # in the queue rather than holding the others until the time limit (slurm_requeue.py).
        slurm_requeue.requeue_if_batch_node_lost(
            boot.slurm_requeue_job,
            boot.slurm_restart_count,
            host=boot.host,
            lost_at=agent.ended_at,
        )
    return code


if __name__ == "__main__":
    sys.exit(main())
