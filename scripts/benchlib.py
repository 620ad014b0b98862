"""What the benchmarks share: running a launcher, summarizing trials, one table, JSON.

Every script in scripts/ measures ftrun next to an anchor (plain torchrun, torch.save, DCP) in
the same run, on the same machine, and prints the two side by side. This module owns the parts
that are the same in all of them, so that each script holds only what it measures:

- `Run`: a launcher in its own session, its output kept line by line, waited for with a
  timeout, and its whole tree killed at the end (also children that made sessions of their own:
  they carry an environment tag). `scratch_tmpdir` gives the launchers a TMPDIR that goes away.
- `summarize`, `median`, `percentile`, `ratio`: trial statistics, with failed trials (None) counted
  and left out of the figures.
- `Table`: the one table format: a row per launcher/method, columns of figures, and next to any
  column that asks for it a ratio column, the row's value over the anchor row's.
- `to_json` / `write_json`: the machine-readable copy of what a script prints.

Imported as `import benchlib` by the scripts run as `python scripts/bench_x.py` (their directory
is sys.path[0]). The statistics and the table are pure (tests/unit/test_benchlib.py); `Run`,
`tagged`, `kill_tagged`, `scratch_tmpdir` and `write_json` touch processes and files.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psutil

TAG = "BENCH_TRIAL"  # the environment variable that marks every process of one Run

# -- statistics -------------------------------------------------------------------------------


def exit_on_sigterm() -> None:
    """Make SIGTERM (`kill`, a CI timeout) unwind like Ctrl-C, so `finally` blocks run: a
    benchmark's checkpoint Managers then remove their memory tier (gigabytes of /dev/shm)."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def add_glibc_default_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--glibc-default",
        action="store_true",
        help="keep glibc's own non-temporal threshold (ranks under ftrun get copy_tunables')",
    )


def start_as_ranks_do(args: argparse.Namespace) -> None:
    """Unless --glibc-default: re-execute this benchmark under the GLIBC_TUNABLES an ftrun agent
    gives the ranks it starts (ftrun/agent/copy_tunables.py), if it does not run under them yet:
    a figure for ftrun is one for a rank under `ftrun launch`, and the anchors share the process."""
    from ftrun.agent import copy_tunables

    env = dict(os.environ)
    if not args.glibc_default and copy_tunables.apply(env) is not None:
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


def median(values: Iterable[float | None]) -> float | None:
    """The median of the values that are not None; None if there are none."""
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def percentile(values: Iterable[float | None], p: float) -> float | None:
    """The p-th percentile (0-100) of the values that are not None, nearest rank: the sorted
    value at index round(p/100 * (n-1)) (numpy's method="nearest"); None if there are none."""
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} is not within 0-100")
    got = sorted(v for v in values if v is not None)
    if not got:
        return None
    return got[min(len(got) - 1, round(p / 100 * (len(got) - 1)))]


def ratio(value: float | None, anchor: float | None) -> float | None:
    """value / anchor, or None when either is missing or the anchor is 0 (no ratio to show)."""
    if value is None or anchor is None or anchor == 0:
        return None
    return value / anchor


@dataclass(frozen=True, kw_only=True)
class Summary:
    """The trials of one launcher (or method, or mode): how many, how many gave a figure, and
    the spread of those figures (None where there is none)."""

    trials: int
    ok: int
    median: float | None
    min: float | None
    max: float | None
    stdev: float | None

    @property
    def failed(self) -> int:
        return self.trials - self.ok

    def as_dict(self, unit: str = "_s") -> dict[str, Any]:
        """For JSON and table rows: trials, ok, failed, median_s, min_s, max_s, stdev_s."""
        return {
            "trials": self.trials,
            "ok": self.ok,
            "failed": self.failed,
            f"median{unit}": self.median,
            f"min{unit}": self.min,
            f"max{unit}": self.max,
            f"stdev{unit}": self.stdev,
        }


def summarize(values: Iterable[float | None]) -> Summary:
    """One value per trial, None for a trial that failed (did not recover, not detected...).
    The standard deviation is 0.0 for a single figure."""
    every = list(values)
    got = [v for v in every if v is not None]
    return Summary(
        trials=len(every),
        ok=len(got),
        median=median(got),
        min=min(got) if got else None,
        max=max(got) if got else None,
        stdev=statistics.stdev(got) if len(got) > 1 else (0.0 if got else None),
    )


# -- the table --------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Column:
    """One column: `key` in each row (a missing key or None shows as "-"), its header, the
    format spec for numbers (strings are shown as they are), a minimum width, and `ratio`: the
    format spec of a ratio column that follows it (None: no ratio column)."""

    key: str
    header: str
    spec: str = ""
    width: int = 0
    align: Literal["<", ">"] = ">"
    ratio: str | None = None


class Table:
    """Rows side by side: one per launcher, method or mode, in the order given.

    With an `anchor`, each column that asks for a ratio is followed by a "ratio" column: the
    row's value divided by the value of the anchor row (the row whose `name` key equals
    `anchor`; with `group`, the anchor row with the same `group` value, e.g. per fault kind).
    A note under the table says what the ratio is. `render` sizes columns to fit every row;
    `header` and `line` print rows as they come, at the columns' given widths.
    """

    def __init__(
        self,
        columns: Sequence[Column],
        *,
        name: str | None = None,
        anchor: str | None = None,
        group: str | None = None,
    ) -> None:
        if anchor is not None and name is None:
            raise ValueError("a table with an anchor needs the `name` key that finds it")
        self.columns = list(columns)
        self.name, self.anchor, self.group = name, anchor, group

    def render(self, rows: Sequence[Mapping[str, Any]]) -> str:
        cells = [self._cells(row, self._anchor_row(row, rows)) for row in rows]
        heads = self._headers()
        widths = [
            max([len(h), minimum, *(len(c[i]) for c in cells)])
            for i, (h, (minimum, _)) in enumerate(zip(heads, self._layout(), strict=True))
        ]
        lines = [self._join(heads, widths), *(self._join(c, widths) for c in cells)]
        if self.anchor is not None and any(c.ratio is not None for c in self.columns):
            same = f", same {self.group}" if self.group else ""
            lines.append(f"ratio: the row's value / {self.anchor}'s{same}")
        return "\n".join(lines)

    def header(self) -> str:
        return self._join(self._headers(), self._fixed_widths())

    def line(self, row: Mapping[str, Any], anchor_row: Mapping[str, Any] | None = None) -> str:
        return self._join(self._cells(row, anchor_row), self._fixed_widths())

    def _layout(self) -> list[tuple[int, str]]:
        """(minimum width, alignment) of every printed column, ratio columns included."""
        out: list[tuple[int, str]] = []
        for c in self.columns:
            out.append((c.width, c.align))
            if c.ratio is not None:
                out.append((0, ">"))
        return out

    def _headers(self) -> list[str]:
        out: list[str] = []
        for c in self.columns:
            out.append(c.header)
            if c.ratio is not None:
                out.append("ratio")
        return out

    def _fixed_widths(self) -> list[int]:
        return [max(len(h), w) for h, (w, _) in zip(self._headers(), self._layout(), strict=True)]

    def _anchor_row(
        self, row: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]
    ) -> Mapping[str, Any] | None:
        if self.anchor is None or self.name is None:
            return None
        return next(
            (
                r
                for r in rows
                if r.get(self.name) == self.anchor
                and (self.group is None or r.get(self.group) == row.get(self.group))
            ),
            None,
        )

    def _cells(self, row: Mapping[str, Any], anchor_row: Mapping[str, Any] | None) -> list[str]:
        out: list[str] = []
        for c in self.columns:
            value = row.get(c.key)
            out.append(cell(value, c.spec))
            if c.ratio is not None:
                base = None if anchor_row is None else anchor_row.get(c.key)
                out.append(cell(ratio(_number(value), _number(base)), c.ratio))
        return out

    def _join(self, texts: Sequence[str], widths: Sequence[int]) -> str:
        layout = self._layout()
        parts = [f"{t:{align}{w}}" for t, w, (_, align) in zip(texts, widths, layout, strict=True)]
        return "  ".join(parts).rstrip()


def cell(value: Any, spec: str = "") -> str:
    """A value as the table shows it: None as "-", numbers with `spec`, anything else as str."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(value, spec)
    return str(value)


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


# -- JSON -------------------------------------------------------------------------------------


def to_json(data: Any) -> str:
    """Indented JSON; what JSON cannot hold (paths, tuples as keys aside) goes in as str."""
    return json.dumps(data, indent=2, default=str)


def write_json(path: str | Path, data: Any) -> None:
    Path(path).write_text(to_json(data) + "\n")


# -- running a launcher -----------------------------------------------------------------------


class Run:
    """A launcher (or ssh client) in its own session, its output kept line by line, its whole
    local tree killable: by process group, and by the environment tag every descendant carries
    (torchrun's workers and ftrun's agents make sessions of their own).

    With `log`, the output goes straight to that file instead (for a launcher that prints
    gigabytes: nothing is held in memory and nothing here slows the writer down); `text` reads
    it back and `lines` stays empty.
    """

    def __init__(
        self,
        cmd: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        log: str | Path | None = None,
    ) -> None:
        self.tag = uuid.uuid4().hex
        self.log = None if log is None else Path(log)
        self.lines: list[str] = []
        self.started = time.monotonic()
        self.ended: float | None = None
        with open(self.log, "wb") if self.log else _no_file() as sink:
            self.proc = subprocess.Popen(
                list(cmd),
                stdout=subprocess.PIPE if sink is None else sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
                start_new_session=True,
                cwd=cwd,
                env={**os.environ, **(env or {}), TAG: self.tag},
            )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        if self.proc.stdout is None:  # written to the log file
            return
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def text(self) -> str:
        if self.log is not None:
            return self.log.read_text(errors="replace").rstrip("\n")
        return "\n".join(self.lines)

    def tail(self, chars: int) -> str:
        """The last `chars` characters of the output (of the log file: without reading it all)."""
        if self.log is None:
            return self.text()[-chars:]
        with open(self.log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4 * chars))
            return f.read().decode(errors="replace").rstrip("\n")[-chars:]

    @property
    def wall_s(self) -> float:
        """Seconds from the start to its exit (as seen by wait or close), or until now."""
        return (self.ended or time.monotonic()) - self.started

    def wait_for(self, pattern: str | re.Pattern[str], timeout_s: float) -> re.Match[str] | None:
        """The first line from the start that matches `pattern` (searched line by line, so `^`
        is a line's start); None on timeout, or once the process has exited and every line of
        its output was searched. Not with `log`."""
        if self.log is not None:
            raise ValueError("wait_for reads the output kept in memory: this run has a log file")
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout_s
        seen = 0
        while time.monotonic() < deadline:
            exited = self.proc.poll() is not None and not self._reader.is_alive()
            upto = len(self.lines)
            for line in self.lines[seen:upto]:
                m = regex.search(line)
                if m:
                    return m
            seen = upto
            if exited:
                return None
            time.sleep(0.02)
        return None

    def wait(self, timeout_s: float) -> int | None:
        """The exit code, or None if it is still running after timeout_s."""
        try:
            rc = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        self.ended = self.ended or time.monotonic()
        return rc

    def interrupt(self, timeout_s: float) -> int | None:
        """SIGINT to the process group, as Ctrl-C in a terminal; the exit code, or None."""
        try:
            os.killpg(self.proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        return self.wait(timeout_s)

    def close(self) -> None:
        """SIGKILL the group and every tagged process, reap, and read the last of the output.
        Idempotent."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        kill_tagged(self.tag)
        self.proc.wait(timeout=30)
        self.ended = self.ended or time.monotonic()
        self._reader.join(timeout=5)


def tagged(*tags: str) -> list[psutil.Process]:
    """Every process whose environment carries one of these tags (see `Run.tag`)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(TAG) in tags:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def kill_tagged(*tags: str) -> None:
    """SIGKILL every process whose environment carries one of these tags."""
    for proc in tagged(*tags):
        try:
            proc.kill()
        except psutil.Error:
            continue


@contextmanager
def _no_file() -> Iterator[None]:
    yield None


@contextmanager
def scratch_tmpdir() -> Iterator[str]:
    """TMPDIR for this process and the launchers it starts, removed at the end: plain torchrun
    leaves a mkdtemp of its own (torchelastic_*) in $TMPDIR on every run."""
    before = os.environ.get("TMPDIR")
    with tempfile.TemporaryDirectory(prefix="bench-tmp-") as scratch:
        os.environ["TMPDIR"] = scratch
        try:
            yield scratch
        finally:
            if before is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = before
