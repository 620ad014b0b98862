"""The job's checkpoint key: made once per job, kept in the job directory, handed to the agents.

ftrun.checkpoint authenticates every pickle and manifest it writes with an HMAC under this key
(ftrun/checkpoint/auth.py), so a checkpoint that another user planted or altered is never
loaded. A storage checkpoint must still verify after the controller restarts or Slurm requeues
the job, so the key lives with the job, in `<job dir>/checkpoint.key`: 32 random bytes as hex,
mode 0600, created with O_EXCL | O_NOFOLLOW the first time and reused after; refused unless it is
a regular file of ours that group and others cannot read, in a job directory that they cannot
write (ftrun/private.py). It reaches the agents in their Bootstrap, on stdin, and each rank in
FTRUN_CHECKPOINT_KEY, never on a command line.

A user who wants jobs to share checkpoints (a new job that resumes an older one's) exports
FTRUN_CHECKPOINT_KEY before `ftrun launch`: that key is the job's, and no file is made.
"""

from __future__ import annotations

from collections.abc import Mapping

from ftrun import envcontract, private
from ftrun.jobfiles import JobDir

KEY_FILE = "checkpoint.key"  # the same name as ftrun/checkpoint/auth.py's per-user key
HINT = (
    f"remove {KEY_FILE} if it is not the job's own (its checkpoints in storage will no longer "
    f"load), or export {envcontract.CHECKPOINT_KEY} (64 hex digits) before launching"
)


def job_checkpoint_key(files: JobDir, launcher_env: Mapping[str, str]) -> str:
    """The job's checkpoint key as hex: the launcher's FTRUN_CHECKPOINT_KEY when it has one,
    else `<job dir>/checkpoint.key`, made if missing. UsageError when either is not safe or no
    key."""
    given = launcher_env.get(envcontract.CHECKPOINT_KEY)
    if given:
        source = f"${envcontract.CHECKPOINT_KEY}"
        return private.parse_key(given, source=source, hint=HINT).hex()
    key = private.key_file(
        files.path / KEY_FILE,
        dir_forbid=private.GROUP_OTHER_WRITE,
        what="the job's checkpoint key",
        hint=HINT,
        dir_fd=files.fd,  # the job directory, checked and held open (ftrun/jobfiles.py)
    )
    return key.hex()
