"""Where a job's host-memory checkpoint tier lives: `/dev/shm/ftrun-<uid>/<job id>/`.

One rule for the ranks that write it (ftrun.checkpoint), the agent that removes it at job end
and sweeps the orphans (ftrun/agent/workdir.py, tiers.py), and anything that reports on it.
The per-user parent is 0700, so no other user can plant or open anything under it
(docs/security.md). Ground floor: imports nothing of ftrun.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path("/dev/shm")


def user_dir_name() -> str:
    """This user's private parent of every memory tier in a root: `ftrun-<uid>`."""
    return f"ftrun-{os.geteuid()}"


def tier_dir(job_id: str, root: Path | str = ROOT) -> Path:
    """The job's tier under `root` (the caller has checked `job_id`: ftrun/jobid.py)."""
    return Path(root) / user_dir_name() / job_id
