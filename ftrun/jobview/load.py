"""A job read from its directory: the journal folded (from its summary on), plus what each
restart restored.

`ftrun.checkpoint` prints one line, `ftrun-checkpoint: restored step N from memory|storage` (or
`no checkpoint found`), into the rank log that the agent already relays into the job directory,
so no new message kind is needed to tell how much a restart lost.
"""

from __future__ import annotations

import re
from pathlib import Path

from ftrun.errors import UsageError
from ftrun.jobview.fold import JobFolder
from ftrun.jobview.summary import read_summary
from ftrun.jobview.views import JobView
from ftrun.journal.read import JournalParser, stream_journal

# Printed by ftrun.checkpoint on restore (ftrun/checkpoint/restore.py, `_done`); not imported
# from there because that module imports torch. tests/unit/test_jobview.py checks both agree.
RESTORE_LINE = re.compile(
    r"^ftrun-checkpoint: (?:restored step (\d+) from (memory|storage)"
    r"|no checkpoint found, starting from step (0))$"
)
RESTORE_SCAN_BYTES = 1 << 20  # restore runs at start-up: its line is near the top of the log


def load_job(job_dir: Path, *, summary: bool = True) -> JobView:
    """The job as its journal tells it: from its summary and the journal past it (summary.py),
    or, without a summary (or with `summary=False`), the whole journal streamed through the
    fold. A journal that cannot be read at all (permissions, an I/O error) is a damaged job
    with no events: one such job does not break a listing."""
    kept = read_summary(job_dir) if summary else None
    folder, parser = kept if kept is not None else (JobFolder(), JournalParser())
    try:
        for event in stream_journal(job_dir, parser, offset=parser.offset):
            folder.feed(event)
    except UsageError as e:
        view = JobFolder().view(job_dir)
        view.damaged = e.message
        return view
    view = folder.view(job_dir)
    view.damaged = parser.damage
    for inc in view.incidents:
        if inc.next_generation is not None:
            found = read_restore(job_dir / "logs" / f"g{inc.next_generation}")
            if found is not None:
                inc.restored_step, inc.restored_tier = found
    return view


def read_restore(log_dir: Path) -> tuple[int, str] | None:
    """(step, tier) that the ranks of one generation restored, from the first rank log that says
    so (every rank restores the same step from the same tier); None if none says so (yet)."""
    try:
        logs = sorted(log_dir.glob("rank*.log"), key=lambda p: (len(p.name), p.name))
    except OSError:
        return None
    for path in logs:
        try:
            with open(path, "rb") as f:
                head = f.read(RESTORE_SCAN_BYTES)
        except OSError:
            continue
        for line in head.decode("utf-8", "replace").splitlines():
            m = RESTORE_LINE.match(line.strip())
            if m:
                return (int(m.group(1)), m.group(2)) if m.group(1) else (0, "none")
    return None
