"""scripts/benchlib.py: the statistics and the one table every benchmark prints, and `Run`'s
promise that nothing it started outlives it."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import benchlib
from benchlib import Column, Table


def test_median_leaves_failed_trials_out() -> None:
    assert benchlib.median([3.0, None, 1.0, 2.0]) == 2.0
    assert benchlib.median([4.0, 1.0, None, 2.0, 3.0, None]) == 2.5
    assert benchlib.median([None, None]) is None
    assert benchlib.median([]) is None


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        (0, 10.0),
        (50, 50.0),
        (99, 100.0),
        (100, 100.0),
        (25, 30.0),  # index 0.25 * 9 = 2.25 -> 2
        (75, 80.0),  # 6.75 -> 7
        (90, 90.0),  # 8.1 -> 8
    ],
)
def test_percentile_is_nearest_rank_of_the_sorted_values(p: float, expected: float) -> None:
    values = [100.0, 10.0, 90.0, 20.0, None, 80.0, 30.0, 70.0, 40.0, 60.0, 50.0]
    assert benchlib.percentile(values, p) == expected


def test_percentile_edges() -> None:
    assert benchlib.percentile([], 50) is None
    assert benchlib.percentile([None], 99) is None
    assert benchlib.percentile([7.0], 99) == 7.0
    assert benchlib.percentile([1.0, 2.0], 50) == 1.0  # index 0.5 rounds half to even: 0
    with pytest.raises(ValueError):
        benchlib.percentile([1.0], 101)


def test_ratio() -> None:
    assert benchlib.ratio(1.5, 3.0) == 0.5
    assert benchlib.ratio(3.0, 1.5) == 2.0
    assert benchlib.ratio(None, 3.0) is None
    assert benchlib.ratio(1.0, None) is None
    assert benchlib.ratio(1.0, 0.0) is None


def test_summarize_counts_failures_and_spreads_the_rest() -> None:
    s = benchlib.summarize([2.0, None, 4.0, 6.0])
    assert (s.trials, s.ok, s.failed) == (4, 3, 1)
    assert (s.median, s.min, s.max) == (4.0, 2.0, 6.0)
    assert s.stdev == pytest.approx(2.0)
    assert s.as_dict() == {
        "trials": 4,
        "ok": 3,
        "failed": 1,
        "median_s": 4.0,
        "min_s": 2.0,
        "max_s": 6.0,
        "stdev_s": pytest.approx(2.0),
    }
    one = benchlib.summarize([1.25])
    assert (one.median, one.stdev) == (1.25, 0.0)
    none = benchlib.summarize([None, None])
    assert (none.trials, none.failed, none.median, none.stdev) == (2, 2, None, None)


def test_cell() -> None:
    assert benchlib.cell(None, ".3f") == "-"
    assert benchlib.cell(float("nan"), ".3f") == "-"
    assert benchlib.cell(0.12345, ".3f") == "0.123"
    assert benchlib.cell(7, ".3f") == "7.000"
    assert benchlib.cell(7) == "7"
    assert benchlib.cell(True, ".3f") == "True"
    assert benchlib.cell("3/5", ".3f") == "3/5"


RESTART = Table(
    [
        Column(key="launcher", header="launcher", align="<"),
        Column(key="trials", header="trials"),
        Column(key="median_s", header="median s", spec=".3f", ratio=".3f"),
        Column(key="max_s", header="max s", spec=".2f"),
    ],
    name="launcher",
    anchor="torchrun",
)


def test_table_renders_a_ratio_to_the_anchor_row() -> None:
    rows = [
        {"launcher": "torchrun", "trials": 5, "median_s": 4.0, "max_s": 5.0},
        {"launcher": "ftrun", "trials": 5, "median_s": 1.0, "max_s": 1.5},
        {"launcher": "ftrun-cold", "trials": 5, "median_s": None},
    ]
    assert RESTART.render(rows) == textwrap.dedent("""\
        launcher    trials  median s  ratio  max s
        torchrun         5     4.000  1.000   5.00
        ftrun            5     1.000  0.250   1.50
        ftrun-cold       5         -      -      -
        ratio: the row's value / torchrun's""")


def test_table_without_the_anchor_row_shows_no_ratio() -> None:
    text = RESTART.render([{"launcher": "ftrun", "trials": 1, "median_s": 2.0, "max_s": 2.0}])
    assert text.splitlines()[1].split() == ["ftrun", "1", "2.000", "-", "2.00"]


def test_table_ratio_within_a_group() -> None:
    table = Table(
        [
            Column(key="fault", header="fault", align="<"),
            Column(key="launcher", header="launcher", align="<"),
            Column(key="median_s", header="median s", spec=".3f", ratio=".2f"),
        ],
        name="launcher",
        anchor="torchrun",
        group="fault",
    )
    rows: list[dict[str, Any]] = [
        {"fault": "crash", "launcher": "ftrun", "median_s": 0.02},
        {"fault": "crash", "launcher": "torchrun", "median_s": 0.16},
        {"fault": "hang", "launcher": "ftrun", "median_s": 1.5},
        {"fault": "hang", "launcher": "torchrun", "median_s": None},
    ]
    lines = table.render(rows).splitlines()
    assert [line.split() for line in lines[1:5]] == [
        ["crash", "ftrun", "0.020", "0.12"],
        ["crash", "torchrun", "0.160", "1.00"],
        ["hang", "ftrun", "1.500", "-"],
        ["hang", "torchrun", "-", "-"],
    ]
    assert lines[5] == "ratio: the row's value / torchrun's, same fault"


def test_table_without_an_anchor_is_a_plain_table() -> None:
    table = Table(
        [Column(key="agents", header="agents"), Column(key="p99_s", header="p99 s", spec=".3f")]
    )
    assert (
        table.render([{"agents": 256, "p99_s": 1.0}, {"agents": 4096, "p99_s": 1.23456}])
        == "agents  p99 s\n   256  1.000\n  4096  1.235"
    )


def test_table_row_by_row_keeps_the_given_widths() -> None:
    table = Table(
        [
            Column(key="script", header="script", width=12, align="<"),
            Column(key="hangs", header="hangs", width=8),
            Column(key="s", header="s/run", spec=".1f"),
        ]
    )
    assert table.header() == "script           hangs  s/run"
    assert (
        table.line({"script": "ddp", "hangs": "w0/c0", "s": 3.14159})
        == "ddp              w0/c0    3.1"
    )


def test_anchor_needs_a_name_key() -> None:
    with pytest.raises(ValueError):
        Table([Column(key="x", header="x", ratio=".2f")], anchor="torchrun")


def test_json_holds_what_json_cannot(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    benchlib.write_json(out, {"dir": tmp_path, "v": [1.5, None]})
    assert out.read_text() == benchlib.to_json({"dir": str(tmp_path), "v": [1.5, None]}) + "\n"


def test_run_keeps_lines_and_kills_a_child_in_a_session_of_its_own(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = textwrap.dedent(f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                 start_new_session=True)
        open({str(pid_file)!r}, "w").write(str(child.pid))
        print("STEP 1 t=1.5", flush=True)
        print("ready", flush=True)
        time.sleep(60)
    """)
    run = benchlib.Run([sys.executable, "-c", code])
    try:
        m = run.wait_for(r"^STEP (\d+) t=([\d.]+)$", 30)
        assert m is not None and m.group(2) == "1.5"
        assert run.wait_for("ready", 30) is not None
        assert run.wait(0.1) is None  # still running
        assert len(benchlib.tagged(run.tag)) == 2
    finally:
        run.close()
    run.close()  # idempotent
    assert benchlib.tagged(run.tag) == []
    assert run.lines == ["STEP 1 t=1.5", "ready"]
    assert run.proc.returncode is not None and run.wall_s > 0


def test_run_to_a_log_file(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    run = benchlib.Run([sys.executable, "-c", "print('a' * 10); print('end')"], log=log)
    try:
        assert run.wait(30) == 0
    finally:
        run.close()
    assert run.lines == []
    assert run.text() == "a" * 10 + "\nend"
    assert run.tail(5) == "a\nend" == run.text()[-5:]
    with pytest.raises(ValueError):
        run.wait_for("end", 1)
