"""The goodput account's raw material, folded one event at a time (goodput.py does the account).

What the journal says goodput needs is small whatever the journal's length: a mark where each
stretch of time begins (a launch, a first step, a fault, a teardown: a few per incident, none
per step) and a few figures per generation (its first and last step, its largest stall). So a
journal of any length folds in memory that grows with its incidents, not with its steps, and a
fold can go on from where it stopped (the controller's summary, jobview/summary.py) with the
events after it. Pure: no I/O, no clock.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any

TRAINING = "training"
RAN = "ran"  # a launched generation of a job without a progress signal: start-up or training
OFF = "off"  # no controller runs: between the runs of a requeued job, after the end
# A launch's mark before the journal tells whether it has steps: start-up or relaunch if it
# has (goodput.account decides at the end), `ran` if it has none.
LAUNCH_FIRST = "launch:startup"
LAUNCH_AGAIN = "launch:relaunch"


@dataclass
class GenFigures:
    """What the journal says about one generation, as far as goodput needs it."""

    number: int
    world_size: int = 0
    first_step: int | None = None
    last_step: int | None = None
    stall_s: float = 0.0
    restore_s: float = 0.0
    restored_step: int | None = None
    predicted_step_s: float | None = None
    full_step_s: float | None = None
    launched: bool = False
    spans: dict[str, float] = field(default_factory=dict)  # label → seconds


@dataclass
class GoodputFold:
    """Marks (t, label, generation that owns the time from t on), in journal order; the
    generations; the job's full world size; whether any step was seen; the last event's time."""

    marks: list[tuple[float, str, int]] = field(default_factory=list)
    gens: dict[int, GenFigures] = field(default_factory=dict)
    full_world: int = 0
    signal: bool = False
    last_t: float | None = None
    current: int = 0  # the generation that owns the time now (0: before the first launch)
    first_of_run: bool = True
    full_step: float | None = None
    predicted: dict[int, float | None] = field(default_factory=dict)  # plan_chosen, by gen

    def feed(self, ev: dict[str, Any]) -> None:
        kind, t = ev["kind"], float(ev.get("t", 0.0))
        self.last_t = t if self.last_t is None else max(self.last_t, t)
        gen = ev.get("gen")
        if kind in ("first_step", "progress") and isinstance(ev.get("step"), int):
            self.signal = True
        if kind == "job_started":
            self.first_of_run = True
            nproc = ev.get("nproc_per_node") or 1
            hosts = ev.get("max_nodes") or len(ev.get("hosts") or [])  # --max-nodes: spot jobs
            self.full_world = self.full_world or hosts * nproc
            self.marks.append((t, "startup", self.current + 1))  # owned by the gen it starts
        elif kind == "plan_chosen" and isinstance(gen, int):
            self.predicted[gen] = ev.get("predicted_step_s")
            if isinstance(ev.get("full_step_s"), (int, float)):
                self.full_step = self.full_step or float(ev["full_step_s"])
        elif kind == "generation_launched" and isinstance(gen, int):
            self.current = gen
            g = self.gens.setdefault(gen, GenFigures(gen))
            g.world_size = ev.get("world_size") or 0
            if gen in self.predicted:
                g.predicted_step_s = self.predicted[gen]
            g.full_step_s = self.full_step
            g.launched = True
            self.marks.append((t, LAUNCH_FIRST if self.first_of_run else LAUNCH_AGAIN, gen))
            self.first_of_run = False
        elif kind in ("first_step", "progress") and isinstance(gen, int) and gen in self.gens:
            g, step = self.gens[gen], ev.get("step")
            if kind == "first_step":
                g.first_step = step
                self.marks.append((t, TRAINING, gen))
            if isinstance(step, int):
                g.last_step = step if g.last_step is None else max(g.last_step, step)
            if isinstance(ev.get("stall_s"), (int, float)):
                g.stall_s = max(g.stall_s, float(ev["stall_s"]))
        elif kind == "checkpoint_restored" and isinstance(gen, int) and gen in self.gens:
            self.gens[gen].restore_s = float(ev.get("restore_s") or 0.0)
            self.gens[gen].restored_step = ev.get("step")
        elif kind == "fault_detected":
            owner = gen if isinstance(gen, int) else self.current
            fault_t = ev.get("fault_t")
            detected_t = float(ev.get("detected_t") or t)
            if isinstance(fault_t, (int, float)) and fault_t < detected_t:
                self.marks.append((float(fault_t), "detection", owner))
            self.marks.append((detected_t, "teardown", owner))
            self._step(owner, ev.get("step"))
        elif kind == "stop_requested" and self.current in self.gens:  # Ctrl-C, SIGTERM
            self.marks.append((t, "teardown", self.current))
        elif kind in ("persist_requested", "reconfigure"):  # a grow's persist: its cost too
            self.marks.append((t, "teardown", gen if isinstance(gen, int) else self.current))
        elif kind == "torn_down":
            self.marks.append((t, "waiting_for_hosts", self.current))
        elif kind == "generation_ended" and isinstance(gen, int):
            self._step(gen, ev.get("step"))
            # After a fault or a reconfiguration: the gap before the next generation; after any
            # other end (succeeded, stopped, preempted): the job shutting down.
            gap = ev.get("outcome") in ("failed", "reconfigured")
            self.marks.append((t, "waiting_for_hosts" if gap else "teardown", gen))
        elif kind == "job_finished":
            self.marks.append((t, OFF, self.current))

    def _step(self, gen: int, step: Any) -> None:
        if isinstance(step, int) and gen in self.gens:
            g = self.gens[gen]
            g.last_step = step if g.last_step is None else max(g.last_step, step)

    def resolved(self) -> tuple[list[tuple[float, str, int]], dict[int, GenFigures]]:
        """The marks by time with each launch's label decided, and a copy of the generations
        (with one for every owner of a mark) for the account to fill in."""
        marks = []
        for t, label, gen in self.marks:
            if label in (LAUNCH_FIRST, LAUNCH_AGAIN):
                label = (label.split(":")[1]) if self.signal else RAN
            marks.append((t, label, gen))
        marks.sort(key=lambda m: m[0])  # stable: marks at one time keep the journal's order
        gens = copy.deepcopy(self.gens)
        for _, _, owner in marks:  # a job that never launched still has its start-up
            gens.setdefault(owner, GenFigures(owner))
        return marks, gens

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["gens"] = [asdict(g) for g in self.gens.values()]
        out["predicted"] = [[g, s] for g, s in self.predicted.items()]
        return out

    @classmethod
    def from_json(cls, state: dict[str, Any]) -> GoodputFold:
        state = dict(state)
        gens = [GenFigures(**g) for g in state.pop("gens")]
        fold = cls(**state)
        fold.marks = [(float(t), str(label), int(g)) for t, label, g in fold.marks]
        fold.gens = {g.number: g for g in gens}
        fold.predicted = {int(g): s for g, s in state["predicted"]}
        return fold
