"""The controller's side of the summary (summary.py): a thread in the launcher's process that
keeps the job's fold current and writes it down.

Once a second it reads the journal's new bytes (only those: it remembers where it stopped),
feeds their events to the fold, writes the summary when anything changed, and hands the job's
view to whoever asked (the metrics: cli/metrics.py renders them from it). It runs beside the
controller's event loop, never in it, and reads the journal as any reader does (journal.py is
not touched: the journal stays the one source). A summary from an earlier run of the job (a
requeue, `ftrun resume`) is where it starts, so a resumed job does not fold its history again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from ftrun.errors import FtrunError
from ftrun.jobfiles import JobDir
from ftrun.jobview.fold import JobFolder
from ftrun.jobview.summary import read_summary, write_summary
from ftrun.jobview.views import JobView
from ftrun.journal.read import JournalParser, stream_journal

SUMMARY_INTERVAL_S = 1.0
STOP_TIMEOUT_S = 10.0
log = logging.getLogger("ftrun.summary")


class SummaryKeeper:
    def __init__(
        self,
        job_dir: Path,
        *,
        interval_s: float = SUMMARY_INTERVAL_S,
        on_view: Callable[[JobView], None] | None = None,
    ) -> None:
        self.job_dir = job_dir
        self.interval_s = interval_s
        self.on_view = on_view
        self.folder = JobFolder()
        self.parser = JournalParser()
        self.written_offset = -1
        self.rounds = 0
        self._files: JobDir | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ftrun-summary", daemon=True)
        self._started = False

    def start(self) -> None:
        kept = read_summary(self.job_dir)
        if kept is not None:
            self.folder, self.parser = kept
            self.written_offset = self.parser.offset
        self._started = True
        self._thread.start()

    def stop(self) -> None:
        """One last round (the job's end is in the journal by now), then no more."""
        self._stop.set()
        if self._started:
            self._thread.join(STOP_TIMEOUT_S)
        if not self._thread.is_alive():
            self.round(final=True)
        if self._files is not None:
            self._files.close()
            self._files = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.round()
            except Exception:  # a summary is a convenience: never the job's end
                log.exception("the job summary could not be kept")

    def round(self, *, final: bool = False) -> None:
        """Fold what the journal gained; write the summary if that was anything; hand on the
        view. The job runs while we do (we are in its process) until the final round."""
        try:
            for event in stream_journal(self.job_dir, self.parser, offset=self.parser.offset):
                self.folder.feed(event)
        except FtrunError as e:  # unreadable: try again next round
            log.warning("cannot read the journal for the summary: %s", e.message)
            return
        self.rounds += 1
        if self.parser.offset != self.written_offset and self._job_dir() is not None:
            assert self._files is not None
            if write_summary(self._files, self.folder, self.parser):
                self.written_offset = self.parser.offset
        if self.on_view is not None:
            view = self.folder.view(self.job_dir, alive=not final)
            view.damaged = self.parser.damage
            self.on_view(view)

    def _job_dir(self) -> JobDir | None:
        if self._files is None:
            try:
                self._files = JobDir.open(self.job_dir, create=False)
            except (OSError, FtrunError):
                return None  # not made yet (the journal makes it), or not ours: no summary
        return self._files


@contextlib.contextmanager
def keeping_summary(
    job_dir: Path, *, on_view: Callable[[JobView], None] | None = None
) -> Iterator[SummaryKeeper]:
    keeper = SummaryKeeper(job_dir, on_view=on_view)
    keeper.start()
    try:
        yield keeper
    finally:
        keeper.stop()
