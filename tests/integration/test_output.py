"""Rank output that used to stop supervision: a line of megabytes with no newline, a fast `\\r`
progress bar, bytes that are not UTF-8, and a burst of ~100 MB. Logs must keep flowing (bounded,
with markers) and a hang after all that must still be detected, by the progress regex."""

from __future__ import annotations

from tests.conftest import BIN


def test_huge_lines_bars_and_bursts_neither_stop_logs_nor_hide_a_later_hang(ftrun, tmp_path):
    result = ftrun.run(
        "launch",
        "--progress-regex",
        r"^step (\d+)",
        "--hang-floor",
        "1.5",
        str(BIN / "noisy.py"),
        "--marker",
        str(tmp_path / "done-once"),
        "--long-mb",
        "2",
        "--bar-kb",
        "700",
        "--burst-mb",
        "100",
        timeout=180,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    job = ftrun.only_job()
    [inc] = job["incidents"]  # the hang after the burst, and nothing else
    assert (inc["kind"], inc["rank"], inc["tier"]) == ("hang", 0, "restart-in-place")
    log = (ftrun.run_dir / job["job_id"] / "logs" / "g1" / "rank0.log").read_bytes()
    lines = log.decode().splitlines()
    [last] = [line for line in lines if line.startswith("AFTER THE BURST")]  # logs kept flowing
    last_step = int(last.rsplit(" ", 1)[1])
    assert last_step > 100 and inc["step_at_fault"] == last_step, inc  # the regex kept up
    assert inc["past_allowance_s"] <= 2.0
    events = ftrun.events(job["job_id"])
    assert not [e for e in events if e["kind"] in ("agent_error", "task_failed")]
    assert max(len(line) for line in lines) < 17_000  # every forwarded line bounded
    [cut] = [line for line in lines if line.startswith("LONG:")]
    assert "line cut at 16384 bytes; the whole line is in localhost:" in cut
    assert "progress done" in lines  # the bar's last state, not 10,000 redraws
    assert sum(line.startswith("progress ") for line in lines) < 20
    assert "bad bytes: \ufffd\ufffd\ufffd(" in lines
    assert any(line.startswith("[ftrun: skipped ") for line in lines)  # the burst: skipped ahead
    assert len(log) < 60 * (1 << 20)
