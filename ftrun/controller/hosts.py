"""Per-host failure history and quarantine. Pure; the caller passes the clock.

A host that fails `failures` times within `window_s` is quarantined for `expiry_s`: no new
generation is placed on it until then (it is treated as needing replacement).
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class QuarantinePolicy:
    failures: int = 3
    window_s: float = 600.0
    expiry_s: float = 3600.0


class HostHealth:
    def __init__(self, policy: QuarantinePolicy) -> None:
        self.policy = policy
        self.failures: dict[str, deque[float]] = defaultdict(deque)
        self.until: dict[str, float] = {}

    def record_failure(self, host: str, now: float) -> bool:
        """Count a failure; True when it puts the host into quarantine."""
        times = self.failures[host]
        times.append(now)
        while times and now - times[0] > self.policy.window_s:
            times.popleft()
        if len(times) >= self.policy.failures and not self.quarantined(host, now):
            self.until[host] = now + self.policy.expiry_s
            return True
        return False

    def quarantined(self, host: str, now: float) -> bool:
        until = self.until.get(host)
        if until is not None and now >= until:
            del self.until[host]
            self.failures[host].clear()
            return False
        return until is not None

    def recent_failures(self, host: str) -> int:
        return len(self.failures.get(host, ()))
