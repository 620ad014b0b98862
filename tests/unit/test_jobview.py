from __future__ import annotations

import os

import psutil

from ftrun.jobview import fold


def events(*items):
    return [{"t": t, "kind": kind, **fields} for t, kind, fields in items]


ME = psutil.Process()


def test_incident_phases_and_costs(tmp_path):
    view = fold(tmp_path / "j", events(
        (100.0, "job_started", {"name": "n", "controller_pid": os.getpid(),
                                "controller_create_time": ME.create_time()}),
        (100.5, "generation_launched", {"gen": 1, "hosts": ["a"], "world_size": 2}),
        (102.0, "first_step", {"gen": 1, "step": 1}),
        (110.1, "fault_detected", {"incident": 1, "gen": 1, "fault": "crash", "rank": 1,
                                   "fault_t": 110.0, "signal": "SIGKILL", "step": 57}),
        (110.1, "fault_classified", {"incident": 1, "tier": "restart-in-place"}),
        (110.2, "torn_down", {"incident": 1, "gen": 1}),
        (110.2, "restart", {"incident": 1, "next_gen": 2}),
        (110.3, "generation_launched", {"gen": 2, "hosts": ["a"], "world_size": 2}),
        (111.0, "first_step", {"gen": 2, "step": 51}),
    ))
    assert (view.state, view.generation, view.restarts) == ("running", 2, 1)
    [inc] = view.incidents
    assert abs(inc.detected_s - 0.1) < 1e-9 and abs(inc.recovered_s - 1.0) < 1e-9
    assert inc.lost_steps == 7  # steps 51..57 are done twice
    assert inc.relaunched_t == 110.3 and inc.next_generation == 2


def test_a_job_whose_controller_is_gone_is_failed(tmp_path):
    view = fold(tmp_path / "j", events((1.0, "job_started", {"controller_pid": 2 ** 22 + 1})))
    assert view.state == "failed" and "controller died" in view.reason


def test_finished_job_keeps_its_state(tmp_path):
    view = fold(tmp_path / "j", events((1.0, "job_started", {}),
                                       (2.0, "job_finished", {"state": "succeeded", "exit_code": 0})))
    assert view.state == "succeeded" and view.to_json()["exit_code"] == 0
