"""The base classes of what the controller receives, typed (inbound.py): a Message, and an
agent's Report about its generation. Their own module so that the messages of one concern can
live in theirs (inbound_checks.py) and inbound.py stays the table of them all."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True, kw_only=True)
class Message:
    """One message the controller took in. KIND is its name on the wire (for logs and refusals;
    nothing dispatches on it)."""

    KIND: ClassVar[str] = ""


@dataclass(frozen=True, kw_only=True)
class Report(Message):
    """What an agent says about its generation (messages.AGENT_REPORT's fields)."""

    gen: int | None  # the generation it speaks of: an older one's is stale
    shrunk: str | None = None  # link.py cut the message to fit a frame
    oseq: int | None = None  # its number among its agent's output (agent/unacked.py)
