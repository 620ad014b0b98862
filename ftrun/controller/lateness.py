"""How late heartbeats arrive, and how late the controller's own loop runs: the numbers that
say how close a job came to a false alarm (docs/timeouts.md). Pure: no I/O, no clock.

Counts in 1 ms buckets up to MAX_MS (one more for everything beyond), so thousands of agents
at several heartbeats a second cost an increment each, and a percentile costs one pass.
"""

from __future__ import annotations

MAX_MS = 5000


class Histogram:
    def __init__(self) -> None:
        self.counts = [0] * (MAX_MS + 2)
        self.n = 0
        self.max_s = 0.0

    def add(self, seconds: float) -> None:
        ms = max(0, int(seconds * 1000))
        self.counts[min(ms, MAX_MS + 1)] += 1
        self.n += 1
        self.max_s = max(self.max_s, seconds)

    def percentile_ms(self, q: float) -> int | None:
        """The q-quantile (0..1) in whole ms; MAX_MS + 1 means "beyond MAX_MS"."""
        if not self.n:
            return None
        rank = max(1, round(q * self.n))
        seen = 0
        for ms, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                return ms
        return MAX_MS + 1  # unreachable: the counts sum to n

    def summary(self) -> dict[str, object]:
        """Percentiles, and the non-empty buckets ({ms: count}) so periods can be merged."""
        return {
            "n": self.n,
            "p50_ms": self.percentile_ms(0.5),
            "p99_ms": self.percentile_ms(0.99),
            "max_ms": round(self.max_s * 1000, 1) if self.n else None,
            "hist": {str(ms): c for ms, c in enumerate(self.counts) if c},
        }

    @classmethod
    def merged(cls, hists: list[dict[str, int]]) -> Histogram:
        """One histogram from several summaries' "hist" (max_s: the largest bucket's floor)."""
        out = cls()
        for hist in hists:
            for ms, count in hist.items():
                out.counts[min(int(ms), MAX_MS + 1)] += count
                out.n += count
                out.max_s = max(out.max_s, int(ms) / 1000)
        return out


class Lateness:
    """One reporting period: heartbeat lateness (gap between two heartbeats of one agent, less
    the interval) and the controller loop's lag (how late its silence check woke up)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.heartbeats = Histogram()
        self.loop = Histogram()
        self.deferred_checks = 0  # silence checks put off because we had stalled ourselves

    def heartbeat_gap(self, gap_s: float) -> None:
        self.heartbeats.add(max(0.0, gap_s - self.interval_s))

    def loop_lag(self, lag_s: float) -> None:
        self.loop.add(max(0.0, lag_s))

    def summary(self) -> dict[str, object]:
        return {
            "heartbeat_late": self.heartbeats.summary(),
            "loop_lag": self.loop.summary(),
            "deferred_checks": self.deferred_checks,
        }
