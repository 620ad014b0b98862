"""Follows the per-rank log files of one generation: new lines, the last lines, and progress.

Ranks write straight to their files (no pipe through the agent that could stall training when the
agent is slow); the agent polls the files' sizes, which costs one stat per rank per tick.
"""

from __future__ import annotations

import os
import re
from collections import deque
from pathlib import Path

TAIL_LINES = 200
MAX_CHUNK = 1 << 20


class RankLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.last_lines: deque[str] = deque(maxlen=TAIL_LINES)
        self.lines_seen = 0

    def read_new(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(MAX_CHUNK)
        except FileNotFoundError:
            return []
        if not data:
            return []
        self.offset += len(data)
        data = self.partial + data
        *complete, self.partial = data.split(b"\n")
        lines = [line.decode("utf-8", "replace").rstrip("\r") for line in complete]
        self.last_lines.extend(lines)
        self.lines_seen += len(lines)
        return lines

    def flush_partial(self) -> list[str]:
        if not self.partial:
            return []
        line = self.partial.decode("utf-8", "replace")
        self.partial = b""
        self.last_lines.append(line)
        self.lines_seen += 1
        return [line]


class GenerationLogs:
    """All rank logs of one generation in one directory (files named rank<R>.log)."""

    def __init__(self, directory: Path, progress_regex: str | None) -> None:
        self.directory = directory
        self.logs: dict[int, RankLog] = {}
        self.progress = re.compile(progress_regex) if progress_regex else None

    def poll(self) -> dict[int, list[str]]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return {}
        for name in names:
            if name.startswith("rank") and name.endswith(".log"):
                rank = int(name[4:-4])
                if rank not in self.logs:
                    self.logs[rank] = RankLog(self.directory / name)
        out = {}
        for rank, log in self.logs.items():
            lines = log.read_new()
            if lines:
                out[rank] = lines
        return out

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
                except (TypeError, ValueError):
                    continue
                best = step if best is None else max(best, step)
        return best

    def tail(self, rank: int) -> list[str]:
        log = self.logs.get(rank)
        return list(log.last_lines) if log else []


# torch.distributed's excepthook (installed by init_process_group) prefixes every line of an
# uncaught exception's traceback with "[rankN]: ".
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ")


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
    for line in lines[start + 1:]:
        block.append(line)
        if line and not line.startswith((" ", "\t")) and not line.startswith("Traceback"):
            break  # the exception line ends the traceback
    return "\n".join(block)


def exception_line(traceback_text: str | None) -> str | None:
    if not traceback_text:
        return None
    last = traceback_text.rstrip().splitlines()[-1].strip()
    return last or None
