"""`ftrun simulate` as a user runs it: the table, --json, --keep for inspect, bad input → exit 2."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import Ftrun
from tests.unit.test_sim import SMALL_4

ROOT = Path(__file__).resolve().parents[2]
PROFILE = str(ROOT / "tests" / "data" / "profile_gpt_small.json")


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "small 4.csv"
    path.write_text(SMALL_4)
    return path


def test_the_table_compares_ftrun_with_checkpoint_restart_and_the_ideal(
    ftrun: Ftrun, trace: Path
) -> None:
    out = ftrun.run("simulate", str(trace))
    assert out.returncode == 0, out.stderr
    rows = {line.split()[1]: line for line in out.stdout.splitlines() if line.startswith("│")}
    assert set(rows) >= {"ftrun", "checkpoint-restart", "ideal"}
    assert "ftrun / checkpoint-restart:" in out.stdout
    assert "where the time went" in out.stdout and "smaller plan" in out.stdout


def test_json_and_kept_journals_that_inspect_reads(
    ftrun: Ftrun, trace: Path, tmp_path: Path
) -> None:
    keep = tmp_path / "kept"
    out = ftrun.run(
        "simulate", str(trace), "--profile", PROFILE, "--nodes-per-host", "8", "--json",
        "--keep", str(keep), "--time-scale", "0.5",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    ours = doc["strategies"]["ftrun"]
    assert 0 < ours["of_ideal"] <= 1.0
    assert doc["strategies"]["ideal"]["goodput"] > 0
    job = Path(ours["journal"]).name
    shown = ftrun.run("inspect", "--run-dir", str(keep), job, "--json")
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    assert view["state"] == "stopped"
    assert view["goodput"]["goodput"] == pytest.approx(ours["goodput"], abs=1e-3)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--nodes-per-host", "0"], "--nodes-per-host must be at least 1"),
        (["--time-scale", "-1"], "--time-scale must be more than 0"),
        (["--baseline-checkpoint-every", "0"], "--baseline-checkpoint-every must be more than 0"),
        (["--max-nodes", "0"], "--max-nodes at least --min-nodes"),
    ],
)
def test_bad_options_are_one_message_and_exit_2(
    ftrun: Ftrun, trace: Path, args: list[str], needle: str
) -> None:
    out = ftrun.run("simulate", str(trace), *args)
    assert out.returncode == 2
    assert needle in out.stderr and "Traceback" not in out.stderr


def test_a_file_that_is_not_a_trace(ftrun: Ftrun, tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("0,add,a\n1,launch,b\n")
    out = ftrun.run("simulate", str(bad))
    assert out.returncode == 2
    assert "line 2: action 'launch'" in out.stderr and "Traceback" not in out.stderr


def test_a_time_in_the_far_future_is_refused(ftrun: Ftrun, tmp_path: Path) -> None:
    """It simulated without end, journaling ~375 MB a minute (issue 34)."""
    far = tmp_path / "far.csv"
    far.write_text("0,add,a\n0,add,b\n999999999999999,remove,a\n")
    out = ftrun.run("simulate", str(far), timeout=30)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "days with its tail: at most 31 (a time in the far future?)" in out.stderr
    # The same trace compressed into an hour is fine: the bound is on the span simulated.
    squeezed = ftrun.run("simulate", str(far), "--time-scale", "3e-12", "--json", timeout=60)
    assert squeezed.returncode == 0, squeezed.stderr


def churn(path: Path, events: int) -> Path:
    lines = ["0,add,n0", "0,add,n1", "0,add,n2", "0,add,n3"]
    t = 60_000
    for i in range(events // 2):
        lines += [f"{t},remove,n{i % 4}", f"{t + 15_000},add,n{i % 4}"]
        t += 30_000
    path.write_text("\n".join(lines) + "\n")
    return path


def test_sigterm_takes_the_temporary_journals_with_it(ftrun: Ftrun, tmp_path: Path) -> None:
    """A timeout or a scheduler's SIGTERM left the temp journals behind (issue 34)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    ftrun.env["TMPDIR"] = str(scratch)
    proc = ftrun.start("simulate", str(churn(tmp_path / "long.csv", 90_000)))
    try:
        deadline = time.monotonic() + 30
        while not list(scratch.glob("ftrun-simulate-*/*")) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.05)
        assert list(scratch.glob("ftrun-simulate-*/*")), "the simulation never began journaling"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert list(scratch.iterdir()) == []
