"""The controller's plan desk (controller/planning.py): which layout each generation runs on which
hosts, what reaches the ranks, what is journaled, and when a grow is worth its restart."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from ftrun import envcontract
from ftrun.config import LaunchConfig
from ftrun.controller.generation import Reconfigure
from ftrun.controller.planning import PROFILE_FILE, PlanDesk, Unplanned, plan_desk
from ftrun.journal import Journal
from ftrun.journal.read import read_events
from ftrun.planner import NoLayoutFits

PROFILE = Path(__file__).resolve().parents[1] / "data" / "profile_gpt_small.json"
HOSTS = ["n1", "n2", "n3", "n4"]


class Notices:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def rank_output(self, rank: int, lines: list[str]) -> None: ...
    def torchrun_output(self, host: str, lines: list[str]) -> None: ...

    def notice(self, text: str, *, level: str = "info") -> None:
        self.lines.append(text)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def desk(tmp_path: Path, clock: Clock | None = None, **config: object) -> tuple[PlanDesk, Journal]:
    cfg = LaunchConfig(
        job_id="j",
        job_name="j",
        run_dir=tmp_path,
        script="train.py",
        hosts=tuple(HOSTS),
        transport="ssh",
        profile=str(PROFILE),
        **config,  # type: ignore[arg-type]
    )
    journal = Journal(cfg.job_dir)
    shutil.copyfile(PROFILE, cfg.job_dir / PROFILE_FILE)
    made = plan_desk(cfg, journal=journal, reporter=Notices())
    assert isinstance(made, PlanDesk)
    if clock is not None:
        made.clock = clock
    return made, journal


def measured(plans: PlanDesk, gen: int, step_s: float, steps: int = 12) -> None:
    """Generation `gen`'s steps as the journal would show them, `step_s` apart: the desk
    weighs a grow once the running plan's steps are steady (plan_learning.py)."""
    assert plans.learning is not None
    for i in range(steps):
        kind = "first_step" if i == 0 else "progress"
        ev = {"t": 1000.0 + i * step_s, "kind": kind, "gen": gen, "step": i + 1}
        plans.learning.follow(json.dumps(ev, separators=(",", ":")))


def events(journal: Journal, kind: str) -> list[dict]:
    return [e for e in read_events(journal.job_dir) if e["kind"] == kind]


def test_the_plan_uses_a_prefix_of_the_hosts_and_reaches_every_rank(tmp_path):
    plans, journal = desk(tmp_path, global_batch=64, device_memory_bytes=2 << 30)
    used = plans.choose(HOSTS, gen=1, why="launch")
    layout = plans.current
    assert layout is not None and layout.slots_used == len(used)
    assert used == HOSTS[: len(used)]
    plan = json.loads(plans.rank_env()[envcontract.PLAN])
    assert plan == json.loads(json.dumps(layout.to_plan()))
    assert plan["dp"] * plan["micro_batch"] * plan["micro_batches"] == 64
    [chosen] = events(journal, "plan_chosen")
    assert chosen["gen"] == 1 and chosen["why"] == "launch" and chosen["hosts"] == used
    assert chosen["layout"] == plan and chosen["previous"] is None
    # The alternatives it beat, each slower or as fast.
    assert chosen["alternatives"]
    assert all(a["predicted_step_s"] >= chosen["predicted_step_s"] for a in chosen["alternatives"])


def test_losing_a_host_replans_on_the_rest_and_keeps_the_global_batch(tmp_path):
    plans, journal = desk(tmp_path, global_batch=64, device_memory_bytes=2 << 30)
    plans.choose(HOSTS, gen=1, why="launch")
    before = plans.current
    used = plans.choose(HOSTS[:3], gen=2, why="n4 lost")
    after = plans.current
    assert before is not None and after is not None
    assert len(used) <= 3 and after.slots_used == len(used)
    assert after.global_batch == before.global_batch == 64
    second = events(journal, "plan_chosen")[1]
    assert second["why"] == "n4 lost" and second["previous"] is not None


def test_no_layout_that_fits_says_why(tmp_path):
    plans, _ = desk(tmp_path, global_batch=64, device_memory_bytes=300 << 20)
    with pytest.raises(NoLayoutFits) as err:
        plans.choose(HOSTS, gen=1, why="launch")
    assert "needs" in err.value.message


def test_a_grow_goes_ahead_only_when_it_pays_for_its_restart(tmp_path):
    clock = Clock()
    plans, journal = desk(
        tmp_path, clock, global_batch=64, device_memory_bytes=2 << 30, replan_horizon_s=2.0
    )
    plans.choose(HOSTS[:2], gen=1, why="launch")
    plans.launched()
    clock.now += 12.0  # start-up to the first step: what a switch costs here
    plans.first_step()
    plans.torn_down(3.0)
    assert plans.switch_cost_s() == pytest.approx(15.0)
    grow = Reconfigure("grow", "n3, n4 ready")
    assert plans.gate(grow, HOSTS[:2], HOSTS[2:]) is None  # the running plan not measured yet
    assert not events(journal, "grow_declined")
    measured(plans, 1, 1.0)
    # Two seconds of training left cannot pay 15 s of restart: declined, journaled once.
    assert plans.gate(grow, HOSTS[:2], HOSTS[2:]) is None
    assert plans.gate(grow, HOSTS[:2], HOSTS[2:]) is None
    [declined] = events(journal, "grow_declined")
    assert declined["hosts"] == HOSTS[2:] and "stay" in declined["reason"]
    # Decided for this generation: the offer is not weighed again until the next one.
    plans.config = dataclasses.replace(plans.config, replan_horizon_s=3600.0)
    assert plans.gate(grow, HOSTS[:2], HOSTS[2:]) is None
    # In the next generation, with an hour ahead, the faster plan pays for it.
    plans.choose(HOSTS[:2], gen=2, why="a rank crashed")
    measured(plans, 2, 1.0)
    change = plans.gate(grow, HOSTS[:2], HOSTS[2:])
    assert change is not None and change.why == "grow" and "grow" in change.detail
    # A removed host is never held back.
    removed = Reconfigure("remove", "n2 removed from the job")
    assert plans.gate(removed, HOSTS[:2], []) is removed


def test_a_job_without_a_profile_is_not_planned(tmp_path):
    cfg = LaunchConfig(job_id="j", job_name="j", run_dir=tmp_path, script="train.py")
    unplanned = plan_desk(cfg, journal=Journal(cfg.job_dir), reporter=Notices())
    assert isinstance(unplanned, Unplanned)
    assert unplanned.choose(["a", "b"], gen=1, why="launch") == ["a", "b"]
    assert unplanned.rank_env() == {}
    grow = Reconfigure("grow", "c ready")
    assert unplanned.gate(grow, ["a"], ["c"]) is grow
