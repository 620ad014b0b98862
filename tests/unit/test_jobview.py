from __future__ import annotations

import os

import psutil

from ftrun.jobview import RESTORE_LINE, fold, load_job
from ftrun.journal import Journal


def events(*items):
    return [{"t": t, "kind": kind, **fields} for t, kind, fields in items]


ME = psutil.Process()


def test_incident_phases_and_costs(tmp_path):
    view = fold(
        tmp_path / "j",
        events(
            (
                100.0,
                "job_started",
                {
                    "name": "n",
                    "controller_pid": os.getpid(),
                    "controller_create_time": ME.create_time(),
                },
            ),
            (100.5, "generation_launched", {"gen": 1, "hosts": ["a"], "world_size": 2}),
            (102.0, "first_step", {"gen": 1, "step": 1}),
            (
                110.1,
                "fault_detected",
                {
                    "incident": 1,
                    "gen": 1,
                    "fault": "crash",
                    "rank": 1,
                    "fault_t": 110.0,
                    "signal": "SIGKILL",
                    "step": 57,
                },
            ),
            (110.1, "fault_classified", {"incident": 1, "tier": "restart-in-place"}),
            (110.2, "torn_down", {"incident": 1, "gen": 1}),
            (110.2, "restart", {"incident": 1, "next_gen": 2}),
            (110.3, "generation_launched", {"gen": 2, "hosts": ["a"], "world_size": 2}),
            (111.0, "first_step", {"gen": 2, "step": 51}),
        ),
    )
    assert (view.state, view.generation, view.restarts) == ("running", 2, 1)
    [inc] = view.incidents
    assert abs(inc.detected_s - 0.1) < 1e-9 and abs(inc.recovered_s - 1.0) < 1e-9
    assert inc.lost_steps == 7  # steps 51..57 are done twice
    assert inc.relaunched_t == 110.3 and inc.next_generation == 2


def test_a_job_whose_controller_is_gone_is_failed(tmp_path):
    view = fold(tmp_path / "j", events((1.0, "job_started", {"controller_pid": 2**22 + 1})))
    assert view.state == "failed" and "controller died" in view.reason


def test_finished_job_keeps_its_state(tmp_path):
    view = fold(
        tmp_path / "j",
        events(
            (1.0, "job_started", {}), (2.0, "job_finished", {"state": "succeeded", "exit_code": 0})
        ),
    )
    assert view.state == "succeeded" and view.to_json()["exit_code"] == 0


def _restarted_job(tmp_path, restore_lines):
    """A journal with one crash at step 57 and a relaunch whose ranks print restore_lines."""
    journal = Journal(tmp_path / "j")
    for kind, fields in (
        (
            "job_started",
            {"controller_pid": os.getpid(), "controller_create_time": ME.create_time()},
        ),
        ("generation_launched", {"gen": 1, "hosts": ["a"], "world_size": 2}),
        ("first_step", {"gen": 1, "step": 1}),
        ("fault_detected", {"incident": 1, "gen": 1, "fault": "crash", "rank": 1, "step": 57}),
        ("fault_classified", {"incident": 1, "tier": "restart-in-place"}),
        ("restart", {"incident": 1, "next_gen": 2}),
        ("generation_launched", {"gen": 2, "hosts": ["a"], "world_size": 2}),
        ("first_step", {"gen": 2, "step": 56}),
    ):
        journal.record(kind, **fields)
    for rank, lines in restore_lines.items():
        journal.append_log(2, f"rank{rank}", lines)
    journal.close()
    return load_job(tmp_path / "j")


def test_inspect_learns_the_restored_step_and_tier_from_the_rank_logs(tmp_path):
    view = _restarted_job(
        tmp_path, {1: ["hello", "ftrun-checkpoint: restored step 55 from memory"]}
    )
    [inc] = view.incidents
    assert (inc.restored_step, inc.restored_tier, inc.lost_steps) == (55, "memory", 2)
    out = inc.to_json()
    assert (out["restored_step"], out["restored_tier"], out["lost_steps"]) == (55, "memory", 2)


def test_no_checkpoint_and_no_restore_line(tmp_path):
    [inc] = _restarted_job(
        tmp_path / "a", {0: ["ftrun-checkpoint: no checkpoint found, starting from step 0"]}
    ).incidents
    assert (inc.restored_step, inc.restored_tier, inc.lost_steps) == (0, "none", 57)
    [inc] = _restarted_job(tmp_path / "b", {0: ["a script without ftrun.checkpoint"]}).incidents
    assert (inc.restored_step, inc.restored_tier) == (None, None)
    assert inc.lost_steps == 2  # from the first step reported again (56)


def test_the_restore_line_ftrun_checkpoint_prints_is_the_one_inspect_reads(capsys):
    from ftrun.checkpoint.comm import Comm
    from ftrun.checkpoint.restore import Restored, _done

    comm = Comm(timeout_s=10)
    for restored, want in (
        (Restored(40, "memory"), (40, "memory")),
        (Restored(7, "storage"), (7, "storage")),
        (Restored(0, "none"), None),
    ):
        _done(restored, comm)
        m = RESTORE_LINE.match(capsys.readouterr().out.strip())
        assert m and (m.groups()[:2] == (str(want[0]), want[1]) if want else m.group(3) == "0")
