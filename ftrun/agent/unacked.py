"""What the agent said that no controller has written yet: the ranks' output and the facts a
generation reports once, kept until a controller acknowledges them, and said again to the next
controller after a loss, so that output survives a controller change (docs/standby.md).

Each such message gets a number of the agent's own (`oseq`, 1, 2, ...: one sequence for the
agent's life, unlike the channel's `seq`, which restarts with every connection). The controller
acknowledges the highest number it has handled (written to the job's logs and its stdout, or
dropped as stale) on its heartbeats, every heartbeat interval (controller/output_acks.py).
Acknowledged messages leave the ring; the rest are sent again, in order and before anything
new, each time the agent connects to a controller (link.py): the same one after a blip, which
drops what it already has, or a new one (`ftrun resume`, the standby's takeover), which writes
them. So a line is written at least once; twice only across a controller change, for what the
old controller wrote in its last heartbeat interval before it died.

Which messages (REPLAYED): `log` (the output), and the facts an agent reports once and never
again, whose loss would leave an adopted generation unjudged: a rank's exit, a hang, torchrun's
exit. Not periodic reports (progress, pace, idle, checkpoint commits: the next one supersedes a
lost one), nor answers to a controller's request (`stopped`, `link_probed`: a new controller
asks again).

Bounded by bytes and by count: when the controller acknowledges nothing for long (a grace spent
reconnecting while the ranks print), the oldest messages are dropped, with one warning for the
whole overflow, and the next controller is told how many (link.py sends `dropped_note`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from typing import Any, NamedTuple

log = logging.getLogger("ftrun.agent")

REPLAYED = frozenset({"log", "rank_exited", "rank_hung", "gen_exited"})
# A chatty rank prints ~1 MB/s at most through the forwarding (genrun.py's MAX_UNSENT_BYTES
# holds back more): 16 MiB covers a fence timeout and a takeover with room to spare.
MAX_UNACKED_BYTES = 16 << 20
MAX_UNACKED_MESSAGES = 16384
ENTRY_OVERHEAD = 64  # a message's envelope and fields beside its text, roughly


class Entry(NamedTuple):  # a tuple: made for every line batch, it must cost little
    number: int
    kind: str
    fields: dict[str, Any]  # with the number as `oseq`: sent again exactly as first sent
    size: int


class UnackedRing:
    def __init__(
        self, *, max_bytes: int = MAX_UNACKED_BYTES, max_messages: int = MAX_UNACKED_MESSAGES
    ) -> None:
        self.max_bytes = max_bytes
        self.max_messages = max_messages
        self._entries: deque[Entry] = deque()
        self._bytes = 0
        self._last = 0  # the number given last
        self.acked = 0  # the highest number a controller acknowledged
        self.dropped = 0  # messages pushed out before any controller acknowledged them
        self.untold = 0  # of those, how many no controller has been told of yet
        self._overflowing = False  # warned for the overflow under way

    def add(self, kind: str, fields: dict[str, Any]) -> dict[str, Any]:
        """Number a message and keep it; its fields to send, with the number. The ring takes
        `fields` as it is (no copy): the caller must not change it after."""
        self._last += 1
        fields["oseq"] = self._last
        entry = Entry(self._last, kind, fields, _size(fields))
        self._entries.append(entry)
        self._bytes += entry.size
        while len(self._entries) > 1 and (
            len(self._entries) > self.max_messages or self._bytes > self.max_bytes
        ):
            self._bytes -= self._entries.popleft().size
            self.dropped += 1
            self.untold += 1
            if not self._overflowing:
                self._overflowing = True
                log.warning(
                    "no controller has acknowledged this host's output for %d messages "
                    "(%.1f MiB): dropping the oldest from what would be sent again after a "
                    "controller change (the ranks' log files on this host keep every line)",
                    len(self._entries),
                    self._bytes / (1 << 20),
                )
        return fields

    def ack(self, number: int) -> None:
        """A controller has handled every message up to `number`."""
        if number <= self.acked:
            return
        self.acked = number
        while self._entries and self._entries[0].number <= number:
            self._bytes -= self._entries.popleft().size
        self._overflowing = False  # acknowledged again: a new overflow is warned anew

    def pending(self) -> Iterator[Entry]:
        """What no controller acknowledged, oldest first."""
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes


def _size(fields: dict[str, Any]) -> int:
    """Roughly what a message weighs: its text. Log lines are counted exactly (the common
    case, cheaply); other kinds (rare) by their fields' text."""
    lines = fields.get("lines")
    if isinstance(lines, list):
        return ENTRY_OVERHEAD + sum(len(line) for line in lines)
    return ENTRY_OVERHEAD + sum(len(str(v)) for v in fields.values())
