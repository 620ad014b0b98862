"""`ftrun plan` as a user runs it: the table, --json against the contract, bad input → exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Ftrun
from tests.unit.test_planner_rank import PLAN_KEYS

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = str(ROOT / "tests" / "data" / "profile_gpt_small.json")


def test_table_shows_the_best_layout_first(ftrun: Ftrun) -> None:
    out = ftrun.run("plan", "--profile", SAMPLE, "--slots", "8,8,8,7", "--top", "3")
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("│")]
    assert len(rows) == 3
    assert "DP8×PP3 1F1B" in rows[0] and "0-4|5-8|9" in rows[0] and "8 × 8" in rows[0]
    assert "24 (+7 spare)" in rows[0] and "1.00" in rows[0]
    assert "best: DP8×PP3 1F1B" in out.stdout and "host 3: none" in out.stdout


def test_the_worked_example_in_the_docs_is_what_the_code_prints(ftrun: Ftrun) -> None:
    out = ftrun.run(
        "plan",
        "--profile",
        "tests/data/profile_gpt_small.json",
        "--slots",
        "8,8,8,7",
        "--top",
        "6",
        cwd=str(ROOT),
    )
    assert out.returncode == 0, out.stderr
    doc = (ROOT / "docs" / "planner.md").read_text()
    missing = [line for line in out.stdout.splitlines() if line.strip() not in doc]
    assert not missing, "docs/planner.md's worked example is stale: " + "\n".join(missing)


def test_json_is_a_list_of_plans(ftrun: Ftrun) -> None:
    out = ftrun.run(
        "plan",
        "--profile",
        SAMPLE,
        "--slots",
        "4,4",
        "--global-batch",
        "64",
        "--device-memory",
        "8GiB",
        "--schedule",
        "1F1B",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    plans = json.loads(out.stdout)
    assert plans and all(PLAN_KEYS <= set(p) for p in plans)
    assert all(p["global_batch"] == 64 and p["schedule"] == "1F1B" for p in plans)
    assert all(p["figures"]["fits"] and p["figures"]["slots_used"] <= 8 for p in plans)
    assert all(max(p["figures"]["memory_bytes"]) <= 8 * 1024**3 for p in plans)
    assert plans[0]["figures"]["relative"] == 1.0
    steps = [p["predicted_step_s"] for p in plans]
    assert steps == sorted(steps)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--profile", "/nonexistent/p.json", "--slots", "8"], "cannot read the profile"),
        (["--profile", SAMPLE, "--slots", "8,x"], "--slots '8,x' is not"),
        (["--profile", SAMPLE, "--slots", "8", "--device-memory", "16XB"], "'16XB' is not a size"),
        (["--profile", SAMPLE, "--slots", "8", "--device-memory", "100MiB"], "no layout fits"),
        (["--profile", SAMPLE, "--slots", "8", "--schedule", "ZB"], "schedules ['ZB']"),
    ],
)
def test_bad_input_exits_2_with_a_message(ftrun: Ftrun, args: list[str], message: str) -> None:
    out = ftrun.run("plan", *args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert message in out.stderr and "hint:" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_corrupt_profile(ftrun: Ftrun, tmp_path: Path) -> None:
    broken = tmp_path / "broken profile.json"
    broken.write_text("{not json")
    out = ftrun.run("plan", "--profile", str(broken), "--slots", "8")
    assert out.returncode == 2 and "is not JSON" in out.stderr
    broken.write_text(json.dumps({"version": 1, "layers": [{"name": "a"}]}))
    out = ftrun.run("plan", "--profile", str(broken), "--slots", "8", "--global-batch", "8")
    assert out.returncode == 2 and "5 problems" in out.stderr, out.stderr
