"""What the control plane turned away, counted, and told without flooding anything.

A refusal is evidence of a bug or an attack, so it goes to the log and the journal; an attacker
can cause millions of them, so only the first REFUSALS_TOLD of each sort are told, then every
TELL_EVERY-th with the count so far (docs/security.md).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("ftrun.controller")

REFUSALS_TOLD = 20
TELL_EVERY = 1000
EXHAUSTIONS_TELL_EVERY = 100


class Refusals:
    def __init__(self, on_event: Callable[..., Any] | None) -> None:
        self.on_event = on_event
        self.messages = 0  # dropped: failed authentication, schema or identity
        self.connections = 0  # closed before or at their hello
        self.exhaustions = 0  # accept() pauses for lack of descriptors or memory

    def message(self, sender: str, kind: str | None, why: str) -> None:
        self.messages += 1
        n = self.messages
        if n <= REFUSALS_TOLD or n % TELL_EVERY == 0:
            log.warning("refused a message from %s: %s (%d so far)", sender, why[:300], n)
            self._event(
                "message_refused",
                agent=sender,
                message_kind=kind,
                reason=why[:300],
                refused_so_far=n,
            )

    def connection(self, peer: Any, why: str) -> None:
        self.connections += 1
        n = self.connections
        if n <= REFUSALS_TOLD or n % TELL_EVERY == 0:
            log.warning("refused a connection from %s: %s (%d so far)", peer, why, n)
            self._event("connection_refused", peer=str(peer)[:80], reason=why, refused_so_far=n)

    def exhausted(self, error: OSError) -> None:
        """accept() ran out of descriptors or memory (accepting pauses: listener.py); never a
        failure of ours."""
        self.exhaustions += 1
        n = self.exhaustions
        if n == 1 or n % EXHAUSTIONS_TELL_EVERY == 0:
            reason = errno.errorcode.get(error.errno or 0, str(error))
            log.warning("cannot accept connections: %s (%d times so far)", error, n)
            self._event("accept_paused", reason=reason, times=n)

    def close(self) -> None:
        """The totals, once, at the controller's end (the events along the way are sampled)."""
        if self.messages or self.connections or self.exhaustions:
            self._event(
                "refusals",
                connections=self.connections,
                messages=self.messages,
                accept_pauses=self.exhaustions,
            )

    def _event(self, kind: str, **fields: Any) -> None:
        if self.on_event is not None:
            self.on_event(kind, **fields)
