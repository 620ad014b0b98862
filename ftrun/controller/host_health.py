"""Host health: each host's recent failures, and quarantine. Pure; the caller passes the clocks.

A host that fails `failures` times within `window_s` is quarantined for `expiry_s`: no new
generation is placed on it until then, and a failure on it that the policy would restart in
place needs a replacement host instead. A lost host is benched until its agent is back (the
fleet keeps retrying it) and counts towards quarantine like any other failure.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ftrun.controller.evidence import Evidence
from ftrun.controller.policy import Decision, Tier


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

    def judge(
        self, ev: Evidence, decision: Decision, *, now: float, wall_t: float
    ) -> tuple[Decision, list[dict[str, Any]]]:
        """Count a failure the policy did not make fatal against its host. Returns the decision,
        a replacement where the host is (now) quarantined, and the `host_quarantined` events to
        journal. `now` is monotonic; `wall_t` dates the end of a quarantine for people."""
        if ev.host is None or decision.tier is Tier.FATAL:
            return decision, []
        events: list[dict[str, Any]] = []
        if ev.kind == "host-lost":
            events.append(
                {
                    "host": ev.host,
                    "until": "its agent is back",
                    "failures": self.recent_failures(ev.host) + 1,
                }
            )
        q = self.policy
        if self.record_failure(ev.host, now):
            events.append(
                {
                    "host": ev.host,
                    "failures": self.recent_failures(ev.host),
                    "window_s": q.window_s,
                    "until_t": wall_t + q.expiry_s,
                }
            )
        if self.quarantined(ev.host, now) and decision.tier is Tier.RESTART_IN_PLACE:
            decision = Decision(
                Tier.REPLACE_NODE,
                f"{ev.describe()}; host {ev.host} is quarantined for "
                f"{q.expiry_s:g} s after {self.recent_failures(ev.host)} "
                f"failures within {q.window_s:g} s",
                "quarantine",
            )
        return decision, events

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

    def excluded(self, now: float) -> Callable[[str], bool]:
        """Quarantined at `now`: the hosts a plan must leave out."""
        return lambda host: self.quarantined(host, now)

    def recent_failures(self, host: str) -> int:
        return len(self.failures.get(host, ()))
