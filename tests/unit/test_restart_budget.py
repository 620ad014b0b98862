"""The restart budget (--max-restarts) is charged for the job's own failures, not for hosts
that went away: a spot job that loses hosts all day still restarts in place when it crashes,
and a resumed controller carries both counts on from the journal."""

from __future__ import annotations

import json
from pathlib import Path

from ftrun.config import LaunchConfig
from ftrun.controller.evidence import Evidence, Failure
from ftrun.controller.host_health import HostHealth, QuarantinePolicy
from ftrun.controller.incidents import Incidents
from ftrun.controller.policy import History, Tier, classify
from ftrun.journal import Journal
from ftrun.journal.read import resume_point


def test_lost_hosts_do_not_spend_the_restart_budget(tmp_path: Path) -> None:
    config = LaunchConfig(job_id="j", job_name="j", run_dir=tmp_path, script="t.py", max_restarts=2)
    journal = Journal(tmp_path / "j")
    incidents = Incidents(config, rules=(), health=HostHealth(QuarantinePolicy()), journal=journal)
    lost = Failure(Evidence(kind="host-lost", host="b", step=10), fault_t=1.0)
    crash = Failure(Evidence(kind="crash", host="a", rank=0, exit_code=1, step=20), fault_t=2.0)
    for gen in (2, 3, 4):  # three spot reclaims, more than the budget of 2
        incidents.open()
        incidents.restarted(lost, next_gen=gen, backoff_s=0.0)
    assert (incidents.restarts, incidents.replacements, incidents.relaunches) == (0, 3, 3)
    assert incidents.budget_note(lost) == "a lost host: not counted against --max-restarts"
    history = History(restarts_used=incidents.restarts, ever_progressed=True)
    assert classify(crash.evidence, history, max_restarts=2).tier is Tier.RESTART_IN_PLACE
    incidents.open()
    incidents.restarted(crash, next_gen=5, backoff_s=0.0)
    assert incidents.budget_note(crash) == "restart 1/2"
    journal.close()

    events = [json.loads(line) for line in (tmp_path / "j" / "events.jsonl").read_text().split()]
    assert [e["charged"] for e in events if e["kind"] == "restart"] == [False] * 3 + [True]
    point = resume_point(events)
    assert (point.restarts, point.replacements) == (1, 3)
    # A journal from before the field: every restart was charged.
    old = [{"t": 1.0, "kind": "restart", "incident": 1}, {"t": 2.0, "kind": "restart"}]
    assert (resume_point(old).restarts, resume_point(old).replacements) == (2, 0)
