"""Follows the per-rank log files of one generation: new lines, the last lines, and progress.

Ranks write straight to their files (no pipe through the agent that could stall training when the
agent is slow); the agent polls the files' sizes, which costs one stat per rank per tick.

The agent must keep up with any rank, whatever it writes (lines.py bounds each line): a poll
reads at most READ_CHUNK bytes per rank, and a rank more than BACKLOG_SKIP_BYTES behind is
skipped to its last SKIP_KEEP_BYTES with one marker line naming the bytes skipped and the file
that keeps them. So a rank writing 100 MB/s costs the agent a bounded amount of time and memory
per tick, and forwarding stays current. Progress must not be skipped with the rest (a rank that
prints a step line per MB of output would look hung): the last SKIP_SCAN_BYTES before the skip
point are searched, in one C-speed regex pass over the bytes, for the last progress line.
"""

from __future__ import annotations

import os
import re
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ftrun.agent.lines import MAX_LINE_BYTES, Lines, LineSplitter

TAIL_LINES = 200
READ_CHUNK = 512 * 1024
BACKLOG_SKIP_BYTES = 4 * 1024 * 1024
SKIP_KEEP_BYTES = 256 * 1024
SKIP_SCAN_BYTES = 2 * 1024 * 1024


class RankLog:
    def __init__(
        self, path: Path, *, host: str | None = None, progress: re.Pattern[str] | None = None
    ) -> None:
        self.path = path
        self.progress = progress
        self.progress_bytes = _bytes_pattern(progress)
        self.where = f"{host}:{path}" if host else str(path)
        self.offset = 0
        self.splitter = LineSplitter(self.where)
        self.last_lines: deque[str] = deque(maxlen=TAIL_LINES)
        self.lines_seen = 0
        self.skipped_bytes = 0
        self.behind = 0  # bytes left unread at the last read

    def read_new(self, now: float) -> Lines:
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                out = Lines()
                if size - self.offset > BACKLOG_SKIP_BYTES:
                    skip_to = size - SKIP_KEEP_BYTES
                    if (step_line := self._last_progress(f, skip_to)) is not None:
                        out.progress.append(step_line)
                    out.add(self._skip_to(skip_to))
                f.seek(self.offset)
                data = f.read(READ_CHUNK)
        except FileNotFoundError:
            return Lines()
        self.behind = max(0, size - self.offset - len(data))
        if data:
            self.offset += len(data)
            out.extend(self.splitter.feed(data, now))
        return self._seen(out)

    def flush_partial(self) -> Lines:
        return self._seen(self.splitter.flush())

    def _skip_to(self, offset: int) -> str:
        skipped = offset - self.offset
        self.skipped_bytes += skipped
        self.offset = offset
        self.splitter.resync()
        return (
            f"[ftrun: skipped {skipped} bytes of this rank's output to keep up "
            f"({self.skipped_bytes} in all); every byte is in {self.where}]"
        )

    def _last_progress(self, f: BinaryIO, end: int) -> str | None:
        """The last line before `end` (within SKIP_SCAN_BYTES) that the progress regex finds."""
        if self.progress is None or self.progress_bytes is None:
            return None
        start = max(self.offset, end - SKIP_SCAN_BYTES)
        f.seek(start)
        block = f.read(end - start)
        last = None
        for m in self.progress_bytes.finditer(block):
            last = m
        if last is None:
            return None
        line_start = block.rfind(b"\n", 0, last.start()) + 1
        line_end = block.find(b"\n", last.end())
        line = block[line_start : line_end if line_end >= 0 else len(block)][:MAX_LINE_BYTES]
        text = line.decode("utf-8", "replace").replace("\r", "\n").splitlines() or [""]
        matching = [t for t in text if self.progress.search(t)]  # exactly as a line would be
        return matching[-1] if matching else None

    def _seen(self, out: Lines) -> Lines:
        self.last_lines.extend(out.forward)
        self.lines_seen += len(out.forward)
        return out


@dataclass(frozen=True)
class RankNews:
    lines: list[str]  # to forward
    step: int | None  # the highest step the progress regex found, if any


class GenerationLogs:
    """All rank logs of one generation in one directory (files named rank<R>.log)."""

    def __init__(
        self, directory: Path, progress_regex: str | None, *, host: str | None = None
    ) -> None:
        self.directory = directory
        self.host = host
        self.logs: dict[int, RankLog] = {}
        self.progress = re.compile(progress_regex) if progress_regex else None

    def poll(self, now: float | None = None, *, only: int | None = None) -> dict[int, RankNews]:
        """New lines of every rank (or of rank `only`), at most READ_CHUNK bytes of each."""
        now = time.monotonic() if now is None else now
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return {}
        for name in names:
            if name.startswith("rank") and name.endswith(".log") and name[4:-4].isdigit():
                rank = int(name[4:-4])
                if rank not in self.logs:
                    self.logs[rank] = RankLog(
                        self.directory / name, host=self.host, progress=self.progress
                    )
        out = {}
        for rank, log in self.logs.items():
            if only is not None and rank != only:
                continue
            news = self._news(log.read_new(now))
            if news is not None:
                out[rank] = news
        return out

    def behind(self, only: int | None = None) -> int:
        """Bytes the files held beyond what the last poll read."""
        return sum(log.behind for r, log in self.logs.items() if only is None or r == only)

    def flush_partial(self, rank: int) -> RankNews | None:
        log = self.logs.get(rank)
        return self._news(log.flush_partial()) if log else None

    def _news(self, lines: Lines) -> RankNews | None:
        if not lines.forward and not lines.progress:
            return None
        return RankNews(lines.forward, self.last_step(lines.progress))

    def last_step(self, lines: list[str]) -> int | None:
        """The highest step the progress regex finds in these lines."""
        if self.progress is None:
            return None
        best = None
        for line in lines:
            m = self.progress.search(line)
            if m:
                try:
                    step = int(m.group(1))
                except (TypeError, ValueError, IndexError):
                    continue
                best = step if best is None else max(best, step)
        return best

    def tail(self, rank: int) -> list[str]:
        log = self.logs.get(rank)
        return list(log.last_lines) if log else []


# torch.distributed's excepthook (installed by init_process_group) prefixes every line of an
# uncaught exception's traceback with "[rankN]: ".
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ")


def _bytes_pattern(progress: re.Pattern[str] | None) -> re.Pattern[bytes] | None:
    """The progress regex over raw bytes, `^` and `$` at line ends (a line is matched alone).
    None when it cannot be expressed so (then nothing is searched in skipped output)."""
    if progress is None:
        return None
    try:
        return re.compile(progress.pattern.encode(), re.MULTILINE)
    except (re.error, UnicodeEncodeError):
        return None


def extract_traceback(lines: list[str]) -> str | None:
    """The last Python traceback in these lines, through its exception line, without the rank
    prefix torch.distributed may have put on it."""
    lines = [_RANK_PREFIX.sub("", line) for line in lines]
    start = None
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last):"):
            start = i
    if start is None:
        return None
    block = [lines[start]]
    for line in lines[start + 1 :]:
        block.append(line)
        if line and not line.startswith((" ", "\t")) and not line.startswith("Traceback"):
            break  # the exception line ends the traceback
    return "\n".join(block)


def exception_line(traceback_text: str | None) -> str | None:
    if not traceback_text:
        return None
    last = traceback_text.rstrip().splitlines()[-1].strip()
    return last or None
