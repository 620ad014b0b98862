"""Stragglers and each host's pace, folded from the journal (`pace`, `straggler`,
`straggler_recovered`: controller/pace.py) for `inspect`, `status --json` and the metrics; and
the link check's last verdict, before the first step or on hosts joining between generations
(`link_check`: controller/link_check.py), the other way a slow host is found."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PACE_KINDS = frozenset(
    {"pace", "straggler", "straggler_recovered", "generation_launched", "link_check"}
)
LINK_CHECK_FIELDS = ("seconds", "hosts", "joining", "typical_latency_s", "typical_bandwidth_Bps",
                     "bad_hosts", "bad_links", "note")  # fmt: skip
MAX_KEPT = 200  # stragglers kept in the view: a job names few; a pathological one is bounded


@dataclass
class PaceFold:
    unit: str = "host"  # what the latest figures compare: hosts, or a one-host job's ranks
    latest: dict[str, float] = field(default_factory=dict)  # unit → compute s a step, this gen
    stragglers: list[dict[str, Any]] = field(default_factory=list)
    link_check: dict[str, Any] | None = None  # the last one's verdict (its pairs: the journal)

    def feed(self, ev: dict[str, Any]) -> None:
        kind = ev["kind"]
        if kind == "generation_launched":
            self.latest = {}
        elif kind == "pace" and isinstance(ev.get("compute_s"), dict):
            self.unit = str(ev.get("unit") or "host")
            self.latest = {str(k): float(v) for k, v in ev["compute_s"].items()
                           if isinstance(v, int | float)}  # fmt: skip
        elif kind == "straggler" and len(self.stragglers) < MAX_KEPT:
            keep = ("gen", "unit", "compute_s", "median_s", "ratio", "step", "t")
            self.stragglers.append({k: ev.get(k) for k in keep} | {"recovered_t": None})
        elif kind == "link_check":
            self.link_check = {k: ev.get(k) for k in LINK_CHECK_FIELDS}
        elif kind == "straggler_recovered":
            for s in reversed(self.stragglers):
                if s["unit"] == ev.get("unit") and s["recovered_t"] is None:
                    s["recovered_t"] = ev.get("t")
                    break

    def to_json(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "latest": self.latest,
            "stragglers": self.stragglers,
            "link_check": self.link_check,
        }

    @classmethod
    def from_json(cls, state: dict[str, Any] | None) -> PaceFold:
        if not state:
            return cls()
        return cls(
            str(state["unit"]),
            dict(state["latest"]),
            list(state["stragglers"]),
            state.get("link_check"),
        )
