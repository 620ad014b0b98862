"""The one rule for a job id, shared by the CLI (`--job-id`, the ids it makes) and ftrun.checkpoint
(the memory tier's directory): a copy of it in each once disagreed on the first character, and a
script named `_train.py` got an id every rank's Manager refused.

Letters, digits, `_`, `.` and `-`, not starting with `.` or `-` (a hidden or option-like name),
at most 100 characters (it ends up in socket paths, which Linux caps at 108 bytes). Matched whole:
a trailing newline is not a job id.
"""

from __future__ import annotations

import re

RULE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
WHAT = "letters, digits, '_', '.' or '-', not starting with '.' or '-', at most 100"


def valid(job_id: str) -> bool:
    return RULE.fullmatch(job_id) is not None
