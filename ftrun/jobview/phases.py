"""An incident's time cut into phases, in the words of the goodput account.

`Incident.phases()` gives the points (fault, detected, torn down, relaunched, first step again);
each piece between two of them is named by the point it ends at, with goodput's bucket labels,
since ftrun.jobview.goodput cuts the same time at the same events: the timeline's colours and
the goodput line under them then speak of the same seconds. The restore that the relaunched
ranks reported (`checkpoint_restored`) is cut out of the relaunch, as goodput does. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from ftrun.jobview.goodput import BUCKET_LABELS
from ftrun.jobview.views import Incident

# The piece of an incident that ends at each point of Incident.phases() (after "fault").
PHASE_OF_POINT = {
    "detected": BUCKET_LABELS["detection"],
    "torn down": BUCKET_LABELS["teardown"],
    # A standby's takeover: from the agents' verdict to the new controller, the hand-over.
    "taken over": BUCKET_LABELS["teardown"],
    "relaunched": BUCKET_LABELS["waiting_for_hosts"],
    "first step again": BUCKET_LABELS["relaunch"],  # ranks start, restore, step once
}
RELAUNCH, RESTORE = BUCKET_LABELS["relaunch"], BUCKET_LABELS["restore"]
PHASES = (*PHASE_OF_POINT.values(), RESTORE)


@dataclass
class PhaseSegment:
    phase: str  # one of PHASES, or several joined by " + " where the journal skipped a point
    start: float
    end: float
    open: bool  # not finished yet (a running job): `end` is now


def segments(
    inc: Incident, *, end: float | None = None, restore: tuple[float, float] | None = None
) -> list[PhaseSegment]:
    """The pieces of an incident between the times the journal has, in wall time. A point the
    journal lacks joins its phase to the next ("teardown + waiting for hosts"). With `end` (a
    running job), the phase under way runs to it, open. `restore`: (when the relaunched ranks
    reported their restore done, how long it took), cut out of the relaunch."""
    out: list[PhaseSegment] = []
    (_, start), *points = inc.phases()
    pending: list[str] = []  # phases whose end the journal has not told (yet)
    for name, t in points:
        pending.append(PHASE_OF_POINT[name])
        if t is None:
            continue
        if start is not None:  # without a fault time, the detection piece is unknown
            out.append(PhaseSegment(" + ".join(pending), start, max(start, t), open=False))
        start, pending = t if start is None else max(start, t), []
    if end is not None and pending and start is not None and end > start:
        out.append(PhaseSegment(pending[0], start, end, open=True))
    return _cut_restore(out, restore) if restore is not None else out


def _cut_restore(pieces: list[PhaseSegment], restore: tuple[float, float]) -> list[PhaseSegment]:
    done_t, seconds = restore
    out: list[PhaseSegment] = []
    for p in pieces:
        r0, r1 = max(p.start, done_t - seconds), min(p.end, done_t)
        if p.phase != RELAUNCH or r1 <= r0:
            out.append(p)
            continue
        out += [
            PhaseSegment(RELAUNCH, p.start, r0, open=False),
            PhaseSegment(RESTORE, r0, r1, open=False),
            PhaseSegment(RELAUNCH, r1, p.end, open=p.open),
        ]
    return [p for p in out if p.end > p.start or p.phase != RELAUNCH]
