"""The DP × PP planner: pure functions from a model profile and the slots to a ranked list of
layouts, and the rule for when changing layout pays (docs/planner.md).

No I/O, no torch, no clock: the controller and `ftrun plan` call it with what they read.
"""

from ftrun.planner.layout import SCHEDULES, Layout, place_ranks
from ftrun.planner.profile import InvalidProfile, LayerProfile, Links, Profile
from ftrun.planner.rank import NoLayoutFits, best_layout, rank_layouts
from ftrun.planner.switch import SwitchDecision, prefer_current_pp, should_switch
from ftrun.units import format_bytes, parse_size

__all__ = [
    "SCHEDULES",
    "InvalidProfile",
    "LayerProfile",
    "Layout",
    "Links",
    "NoLayoutFits",
    "Profile",
    "SwitchDecision",
    "best_layout",
    "format_bytes",
    "parse_size",
    "place_ranks",
    "prefer_current_pp",
    "rank_layouts",
    "should_switch",
]
