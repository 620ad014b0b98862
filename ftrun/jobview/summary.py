"""A job's summary: the journal folded so far, on disk beside it, so that `status`, `status
--watch` and `inspect` cost the same on a journal of a day and one of a month.

The controller's process keeps the fold current (keeper.py) and writes it here, whole and
atomically (a temporary file, then a rename), at most once a second and at the job's end, with
the byte of the journal it covers. A reader takes the summary and folds only the journal past
that byte (a second's events), so its cost does not grow with the journal. The journal stays
the only source (STYLE.md): the summary is a cache of its fold, trusted only while it matches
the journal (same file, not longer than it); without one (jobs older than summaries, a summary
that is damaged or does not match) the reader folds the whole journal, streaming it.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ftrun.jobfiles import JobDir
from ftrun.jobview.fold import JobFolder
from ftrun.jobview.goodput_fold import GoodputFold
from ftrun.jobview.pace_fold import PaceFold
from ftrun.jobview.ranks import RanksFold
from ftrun.jobview.series import Series
from ftrun.jobview.views import Generation, Incident
from ftrun.journal import EVENTS_FILE
from ftrun.journal.read import JournalParser

SUMMARY_FILE = "summary.json"
VERSION = 1
MAX_SUMMARY_BYTES = 64 << 20  # a summary is a few MiB at most; a bigger file is not one of ours


def folder_to_json(folder: JobFolder) -> dict[str, Any]:
    return {
        "job": folder.job,
        "gens": [asdict(g) for g in folder.gens.values()],
        "incidents": [asdict(i) for i in folder.incidents.values()],
        "pending_recovery": folder.pending_recovery,
        "plans": [[g, p] for g, p in folder.plans.items()],
        "hosts": folder.hosts,
        "turned_away": folder.turned_away,
        "ranks": folder.ranks.to_json(),
        "goodput": folder.goodput.to_json(),
        "series": folder.series.to_json(),
        "pace": folder.pace.to_json(),
        "events": folder.events,
    }


def folder_from_json(state: dict[str, Any]) -> JobFolder:
    gens = [Generation(**g) for g in state["gens"]]
    for g in gens:
        g.last_progress = None if g.last_progress is None else tuple(g.last_progress)  # type: ignore[assignment]
    incidents = [Incident(**i) for i in state["incidents"]]
    return JobFolder(
        job=dict(state["job"]),
        gens={g.number: g for g in gens},
        incidents={i.id: i for i in incidents},
        pending_recovery=state["pending_recovery"],
        plans={int(g): dict(p) for g, p in state["plans"]},
        hosts={str(h): str(s) for h, s in state["hosts"].items()},
        turned_away={str(k): int(n) for k, n in state["turned_away"].items()},
        ranks=RanksFold.from_json(state["ranks"]),
        goodput=GoodputFold.from_json(state["goodput"]),
        series=Series.from_json(state["series"]),
        pace=PaceFold.from_json(state.get("pace")),  # a summary of before has none
        events=int(state["events"]),
    )


def journal_identity(job_dir: Path) -> tuple[int, int, int] | None:
    """(device, inode, size) of the journal; None without one."""
    try:
        st = os.stat(job_dir / EVENTS_FILE)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size


def write_summary(files: JobDir, folder: JobFolder, parser: JournalParser) -> bool:
    """Replace the summary, atomically and never through a link (JobDir.replace), readable by
    whoever may read the journal; False when it cannot be written (the job goes on, and
    readers fold the journal instead)."""
    try:
        st = files.lstat(EVENTS_FILE)
        doc = {
            "version": VERSION,
            "journal": {"dev": st.st_dev, "ino": st.st_ino, "offset": parser.offset},
            "parser": parser.to_json(),
            "fold": folder_to_json(folder),
        }
        data = json.dumps(doc, separators=(",", ":"), default=str).encode()
        files.replace(SUMMARY_FILE, data, mode=stat.S_IMODE(st.st_mode))
    except OSError:
        return False
    return True


def read_summary(job_dir: Path) -> tuple[JobFolder, JournalParser] | None:
    """The fold the summary holds and the parser at its byte of the journal, or None where
    there is no summary that matches the journal (then the journal is folded whole)."""
    try:
        fd = os.open(job_dir / SUMMARY_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None  # a FIFO or a device put in its place: not read
            data = f.read(MAX_SUMMARY_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_SUMMARY_BYTES:
        return None
    ident = journal_identity(job_dir)
    try:
        doc = json.loads(data)
        journal = doc["journal"]
        if doc["version"] != VERSION or ident is None:
            return None
        if (journal["dev"], journal["ino"]) != ident[:2] or not 0 <= journal["offset"] <= ident[2]:
            return None
        parser = JournalParser.from_json(doc["parser"])
        if parser.offset != journal["offset"]:
            return None
        return folder_from_json(doc["fold"]), parser
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return None
