"""Whatever bytes a rank or torchrun writes, bounded lines out of them and bounded frames for them.

A training script is not a well-behaved log producer: tqdm redraws a bar with `\\r` and may never
write a newline; a script dumps a tensor or a JSON blob of megabytes on one line; a C extension
writes bytes that are not UTF-8. The agent forwards lines to the controller in frames of at most
MAX_FRAME_BYTES, so everything here is bounded by construction:

- a line is cut at MAX_LINE_BYTES with a visible marker, as soon as it gets that long (a line
  that never ends still shows, and the agent never holds more than one cap of it);
- `\\r` ends a line for the progress regex (every bar state is seen); for people only the bar's
  latest state is forwarded, at most once per BAR_INTERVAL_S, and its last state when the line
  ends (what a terminal would show, not a screenful of redraws);
- bytes that are not UTF-8 are replaced with U+FFFD, never an error;
- `batches` splits lines into groups whose JSON encoding fits a frame with room to spare;
- evidence in reports (tails, tracebacks, stacks) is clipped shorter still, so a report fits one
  frame; `shrunk` is the last resort for a message that would not.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

MAX_LINE_BYTES = 16 * 1024
BAR_INTERVAL_S = 1.0
# JSON (ensure_ascii) writes one character in at most 6 bytes (\\u00XX, \\uXXXX): batches of at
# most this many characters (plus one per line for quotes and comma) stay under 6 × 128 KiB,
# well below protocol.MAX_FRAME_BYTES (1 MiB), whatever the text is.
BATCH_CHARS = 128 * 1024
REPORT_LINE_CHARS = 2048
REPORT_TEXT_CHARS = 32 * 1024
STACKS_CHARS = 128 * 1024  # all ranks' stacks together


@dataclass
class Lines:
    """What one read produced: lines to forward (and keep as the tail), and the lines the
    progress regex should see (the forwarded ones plus every state of a `\\r` bar)."""

    forward: list[str] = field(default_factory=list)
    progress: list[str] = field(default_factory=list)

    def add(self, line: str) -> None:
        self.forward.append(line)
        self.progress.append(line)

    def extend(self, other: Lines) -> None:
        self.forward.extend(other.forward)
        self.progress.extend(other.progress)


class LineSplitter:
    """Turns a byte stream into bounded lines. `where` names what keeps the whole text (the
    rank's log file), for the marker on a cut line."""

    def __init__(
        self,
        where: str | None = None,
        *,
        max_line_bytes: int = MAX_LINE_BYTES,
        bar_interval_s: float = BAR_INTERVAL_S,
    ) -> None:
        self.where = where
        self.max_line_bytes = max_line_bytes
        self.bar_interval_s = bar_interval_s
        self._buf = bytearray()  # the visible part of the current line, at most one cap
        self._cutting = False  # the current segment was cut: drop its bytes until \r or \n
        self._bar: str | None = None  # the latest complete `\r` state of the current line
        self._bar_sent: str | None = None
        self._bar_sent_t = float("-inf")

    def feed(self, data: bytes, now: float) -> Lines:
        out = Lines()
        *ended, rest = data.split(b"\n")
        for piece in ended:
            self._take(piece, out)
            self._end_line(out)
        self._take(rest, out)
        if self._buf and not self._cutting:
            # The unfinished line too: a step printed without a newline (or a bar's newest
            # state) before a hang counts, so the hang is timed from it. Seeing it again once
            # it ends is harmless: progress only moves forward.
            out.progress.append(_decode(self._buf))
        if (
            self._bar is not None
            and self._bar != self._bar_sent
            and now - self._bar_sent_t >= self.bar_interval_s
        ):
            self._bar_sent, self._bar_sent_t = self._bar, now
            out.forward.append(self._bar)  # the regex saw it when its `\r` came
        return out

    def flush(self) -> Lines:
        """The unfinished line, as it stands (the writer exited or the generation ended)."""
        out = Lines()
        if self._buf or (self._bar is not None and self._bar != self._bar_sent):
            self._end_line(out)
        return out

    def resync(self) -> None:
        """Forget the current line and drop bytes until the next line end: the reader skipped
        ahead and is somewhere in the middle of a line."""
        self._buf.clear()
        self._bar = self._bar_sent = None
        self._cutting = True

    def _take(self, piece: bytes, out: Lines) -> None:
        if b"\r" in piece:
            *states, piece = piece.split(b"\r")
            for state in states:
                self._append(state, out)
                if self._buf:
                    self._bar = _decode(self._buf)
                    out.progress.append(self._bar)
                self._buf.clear()
                self._cutting = False
        self._append(piece, out)

    def _append(self, piece: bytes, out: Lines) -> None:
        if self._cutting or not piece:
            return
        room = self.max_line_bytes - len(self._buf)
        if len(piece) <= room:
            self._buf += piece
            return
        self._buf += piece[:room]
        where = f"; the whole line is in {self.where}" if self.where else ""
        out.add(f"{_decode(self._buf)}… [ftrun: line cut at {self.max_line_bytes} bytes{where}]")
        self._buf.clear()
        self._cutting = True

    def _end_line(self, out: Lines) -> None:
        if self._buf:
            out.add(_decode(self._buf))
        elif self._bar is not None:
            if self._bar != self._bar_sent:
                out.forward.append(self._bar)  # "…\r100%\r\n": the bar's last state
        elif not self._cutting:
            out.add("")
        self._buf.clear()
        self._cutting = False
        self._bar = self._bar_sent = None
        self._bar_sent_t = float("-inf")


def _decode(data: bytes | bytearray) -> str:
    return data.decode("utf-8", "replace")


def batches(lines: list[str], budget_chars: int = BATCH_CHARS) -> Iterator[list[str]]:
    """Consecutive groups of lines, each small enough for one frame (lines must be cut first)."""
    batch: list[str] = []
    size = 0
    for line in lines:
        cost = len(line) + 1
        if batch and size + cost > budget_chars:
            yield batch
            batch, size = [], 0
        batch.append(line)
        size += cost
    if batch:
        yield batch


def clip(text: str | None, limit: int) -> str | None:
    """At most `limit` characters of a report field, keeping the end (where errors are)."""
    if text is None or len(text) <= limit:
        return text
    return f"[ftrun: {len(text) - limit} characters cut] …" + text[-limit:]


def report_lines(lines: list[str]) -> list[str]:
    return [clip(line, REPORT_LINE_CHARS) or "" for line in lines]


def shrunk(fields: dict[str, Any]) -> dict[str, Any]:
    """Every string cut to a line's worth, every list to its last lines: fits any frame."""

    def cut(value: Any) -> Any:
        if isinstance(value, str):
            return clip(value, 512)
        if isinstance(value, list):
            return [cut(v) for v in value[-20:]]
        if isinstance(value, dict):
            return {k: cut(v) for k, v in list(value.items())[:64]}
        return value

    return {k: cut(v) for k, v in fields.items()}
