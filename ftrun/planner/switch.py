"""When to change a running job's layout for a faster one, and when to keep its pipeline depth.

A switch costs a restart (checkpoint, relaunch, reshard: `switch_cost_s`, measured by the
controller) and pays back only over the time the job will keep running. Over a horizon H, the
steps the current layout would run in H take H × t_new / t_old on the new one, so switching
saves H × (1 − t_new / t_old) and pays when that exceeds the switch cost. Hysteresis on top: the
relative gain must also exceed `min_gain`, so availability that comes and goes does not make
plans come and go with it (Parcae and Bamboo weigh the same trade on preemptible instances).

A shrink forced by a lost host is not a choice and does not come here: the current layout no
longer has its slots, and the controller takes the best layout that fits what is left.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ftrun.planner.layout import Layout


@dataclass(frozen=True, kw_only=True)
class SwitchDecision:
    """Whether to switch, why (a sentence for the journal), and the seconds the candidate would
    save over the horizon before the switch cost is paid (negative when it is slower)."""

    switch: bool
    reason: str
    gain_s: float


def describe(layout: Layout) -> str:
    """`DP3×PP2 1F1B`"""
    return f"{layout.name} {layout.schedule}"


def should_switch(
    current: Layout | None,
    candidate: Layout,
    *,
    switch_cost_s: float,
    horizon_s: float,
    min_gain: float = 0.05,
) -> SwitchDecision:
    """Switch from `current` to `candidate` only when the time saved over the next `horizon_s`
    exceeds `switch_cost_s` and the step gets at least `min_gain` (a fraction) faster."""
    new = describe(candidate)
    if current is None:
        return SwitchDecision(
            switch=True,
            reason=f"start with {new}: {candidate.step_s:.3g} s/step predicted",
            gain_s=0.0,
        )
    if current.same_plan(candidate):
        return SwitchDecision(switch=False, reason=f"{new} is the current plan", gain_s=0.0)
    t_old, t_new = current.step_s, candidate.step_s
    gain = 1.0 - t_new / t_old
    saved = horizon_s * gain
    figures = f"{t_new:.3g} s/step vs {t_old:.3g} s/step"
    verb = "grow" if candidate.slots_used > current.slots_used else "switch"
    if gain <= min_gain:
        faster = f"{gain:.1%} faster" if gain > 0 else "no faster"
        return SwitchDecision(
            switch=False,
            reason=(
                f"stay on {describe(current)}: {new} would take {figures}, "
                f"{faster}, not more than the {min_gain:.0%} needed to switch"
            ),
            gain_s=saved,
        )
    pays = saved > switch_cost_s
    return SwitchDecision(
        switch=pays,
        reason=(
            f"{verb} to {new}: {figures} saves {saved:.3g} s over the next {horizon_s:.3g} s, "
            f"{'more' if pays else 'less'} than the {switch_cost_s:.3g} s a switch costs"
            + ("" if pays else f"; stay on {describe(current)}")
        ),
        gain_s=saved,
    )


def prefer_current_pp(ranked: Sequence[Layout], current_pp: int, *, within: float = 0.05) -> Layout:
    """The fastest layout with the current pipeline depth when it is within `within` (a
    fraction) of the fastest overall, else the fastest: the same depth keeps the same stage
    split, so a switch moves only replicas, not layers. `ranked` is fastest first."""
    if not ranked:
        raise ValueError("no layouts to choose from")
    best = ranked[0]
    for layout in ranked:
        if layout.pp == current_pp:
            return layout if layout.step_s <= best.step_s * (1 + within) else best
    return best
