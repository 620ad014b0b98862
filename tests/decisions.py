"""A job's decisions, read from its journal: what the job machine (ftrun/controller/job.py)
decided, in order, without the times and figures that differ between a real run and a
simulation of it. The replay test compares a real run on the testbed with `ftrun simulate` of the
same trace by this."""

from __future__ import annotations

from typing import Any

Decision = tuple[Any, ...]


def decisions(events: list[dict[str, Any]]) -> list[Decision]:
    """Each generation's hosts, each fault's host and tier, each restart (charged to the budget
    or not, backed off or not), each change of hosts, grow or removal, and each quarantine."""
    out: list[Decision] = []
    for e in events:
        kind = e["kind"]
        if kind == "generation_launched":
            out.append(("launch", tuple(e["hosts"])))
        elif kind == "fault_detected":
            out.append(("fault", e["fault"], e.get("host")))
        elif kind == "fault_classified":
            out.append(("tier", e["tier"], e["decision"]))
        elif kind == "restart":
            out.append(("restart", e["charged"], e["backoff_s"] > 0))
        elif kind == "hosts_changed":
            out.append(("hosts", e["how"], tuple(e["removed"]), tuple(e["added"])))
        elif kind == "reconfigure":
            out.append(("reconfigure", e["why"]))
        elif kind == "host_quarantined" and "until_t" in e:
            out.append(("quarantine", e["host"]))
    return out
