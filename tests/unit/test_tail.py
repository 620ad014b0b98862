from __future__ import annotations

import json
import os
import tracemalloc

from ftrun.agent import lines as lines_mod
from ftrun.agent import tail as tail_mod
from ftrun.agent.lines import LineSplitter, batches, clip, shrunk
from ftrun.agent.tail import GenerationLogs, exception_line, extract_traceback
from ftrun.wire.protocol import MAX_FRAME_BYTES, encode


def test_follows_rank_files_and_progress(tmp_path):
    logs = GenerationLogs(tmp_path, r"step (\d+)")
    (tmp_path / "rank0.log").write_text("step 1\nstep 2\npart")
    news = logs.poll()
    assert news[0].lines == ["step 1", "step 2"] and news[0].step == 2
    with open(tmp_path / "rank0.log", "a") as f:
        f.write("ial line\n")
    assert logs.poll()[0].lines == ["partial line"]
    assert logs.last_step(["step 3", "noise", "step 10"]) == 10
    assert logs.tail(0)[-1] == "partial line"
    assert logs.poll() == {}


def test_a_step_printed_without_a_newline_counts_before_the_line_ends(tmp_path):
    logs = GenerationLogs(tmp_path, r"step (\d+)")
    (tmp_path / "rank0.log").write_text("step 7")
    news = logs.poll()
    assert news[0].lines == [] and news[0].step == 7
    assert logs.flush_partial(0).lines == ["step 7"]


def test_a_long_line_is_cut_with_a_marker_as_soon_as_it_is_long(tmp_path):
    logs = GenerationLogs(tmp_path, r"step (\d+)", host="h1")
    path = tmp_path / "rank0.log"
    path.write_bytes(b"x" * (2 << 20))  # 2 MiB, no newline yet
    got = logs.poll()[0].lines
    while logs.behind():
        got += logs.poll().get(0, tail_mod.RankNews([], None)).lines
    [cut] = got  # shown at once, though the line has not ended
    assert cut.startswith("x" * 100) and cut.endswith(
        f"line cut at 16384 bytes; the whole line is in h1:{path}]"
    )
    assert len(cut) < lines_mod.MAX_LINE_BYTES + 200
    with open(path, "ab") as f:
        f.write(b"y" * 1000 + b"\nstep 3\n")
    news = logs.poll()
    assert news[0].lines == ["step 3"] and news[0].step == 3  # the rest of the long line: dropped


def test_carriage_returns_end_lines_for_progress_and_forward_the_latest_bar_state():
    split = LineSplitter(bar_interval_s=1.0)
    bar = b"".join(b"\rstep %d |" % i + b"#" * 60 for i in range(1, 10001))  # ~700 KB, no \n
    out = split.feed(bar[: len(bar) // 2], now=0.0)
    assert max(int(p.split()[1]) for p in out.progress if p.startswith("step")) >= 4900
    assert len(out.forward) == 1 and out.forward[0].startswith("step ")  # one snapshot, not 5,000
    assert split.feed(bar[len(bar) // 2 :], now=0.5).forward == []  # within the interval
    later = split.feed(b"\rstep 10001 |", now=1.6)
    assert later.forward == ["step 10000 |" + "#" * 60]  # the newest complete state
    end = split.feed(b"done\n", now=1.7)
    assert end.forward == ["step 10001 |done"]  # what a terminal shows when the line ends
    assert split.feed(b"a\r\nb\n", now=2.0).forward == ["a", "b"]  # \r\n is one line end


def test_invalid_utf8_is_replaced_not_raised():
    out = LineSplitter().feed(b"ok \xff\xfe bytes\n\xe2\x82\n", now=0.0)
    assert out.forward == ["ok \ufffd\ufffd bytes", "\ufffd"]
    json.dumps(out.forward)  # forwardable


def test_a_rank_far_behind_is_skipped_to_its_recent_end(tmp_path):
    logs = GenerationLogs(tmp_path, r"^step (\d+)$", host="h1")
    path = tmp_path / "rank0.log"
    with open(path, "wb") as f:
        for i in range(1, 600_001):  # ~12 MB
            f.write(b"step %d\n" % i)
    size = path.stat().st_size
    news = logs.poll()[0]
    marker = news.lines[0]
    skipped = size - tail_mod.SKIP_KEEP_BYTES
    assert marker.startswith(f"[ftrun: skipped {skipped} bytes") and f"h1:{path}" in marker
    numbers = [int(line.split()[1]) for line in news.lines[1:]]  # whole lines only, no torn one
    assert all(line == f"step {n}" for line, n in zip(news.lines[1:], numbers, strict=True))
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers))) and numbers[0] > 500_000
    steps = [news.step]
    while logs.behind():
        steps.append(logs.poll()[0].step)
    assert steps[-1] == 600_000 and len(steps) <= 2  # caught up at once, the latest line seen
    assert logs.logs[0].offset == size


def test_a_step_line_far_back_in_skipped_output_still_counts(tmp_path):
    # A step line per MB of output: the part kept after a skip often holds none of them.
    logs = GenerationLogs(tmp_path, r"^step (\d+)")
    junk = b"x" * 99 + b"\n"
    with open(tmp_path / "rank0.log", "wb") as f:
        for step in range(1, 11):
            f.write(b"step %d\n" % step + junk * 10_000)
    news = logs.poll()[0]
    assert news.lines[0].startswith("[ftrun: skipped ") and news.step == 10
    assert not any(line.startswith("step") for line in news.lines)  # seen, not forwarded


def test_memory_stays_bounded_whatever_a_rank_writes(tmp_path):
    logs = GenerationLogs(tmp_path, r"step (\d+)")
    path = tmp_path / "rank0.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    chunk = (b"\r" + b"z" * 5000) * 200 + b"w" * (1 << 20)  # bars, then a line with no end
    tracemalloc.start()
    try:
        for _ in range(40):  # 40 MB in all
            os.write(fd, chunk)
            logs.poll()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        os.close(fd)
    # A read chunk and its splitting, and the progress scan of skipped output: not the 40 MB.
    assert peak < 2 * (tail_mod.READ_CHUNK + tail_mod.SKIP_SCAN_BYTES), peak
    assert len(logs.logs[0].splitter._buf) <= lines_mod.MAX_LINE_BYTES


def test_batches_fit_a_frame_even_for_the_worst_text():
    worst = ["\x01" * lines_mod.MAX_LINE_BYTES] * 40 + [""] * 10_000 + ["\ufffd" * 1000] * 50
    groups = list(batches(worst))
    assert [line for g in groups for line in g] == worst and len(groups) > 1
    for group in groups:
        frame = encode(
            {"v": 1, "kind": "log", "seq": 10**9, "gen": 1, "rank": 1, "lines": group}, b"k" * 32
        )
        assert len(frame) < MAX_FRAME_BYTES


def test_a_report_too_big_for_a_frame_is_shrunk_to_fit():
    huge = {
        "gen": 1,
        "stacks": {str(r): "\x01" * 100_000 for r in range(64)},
        "tail": ["\ufffd" * 10_000] * 200,
        "traceback": "x" * 5_000_000,
    }
    frame = encode({"v": 1, "kind": "rank_hung", "seq": 1, **shrunk(huge)}, b"k" * 32)
    assert len(frame) < MAX_FRAME_BYTES


def test_clip_keeps_the_end():
    assert clip("short", 10) == "short" and clip(None, 3) is None
    cut = clip("a" * 100 + "Error: boom", 11)
    assert cut.endswith("Error: boom") and "100 characters cut" in cut


def test_extracts_the_last_traceback():
    lines = [
        "noise",
        "Traceback (most recent call last):",
        '  File "a.py", line 1, in <module>',
        "    f()",
        "ValueError: first",
        "Traceback (most recent call last):",
        '  File "b.py", line 2, in <module>',
        "KeyError: 'k'",
        "after",
    ]
    tb = extract_traceback(lines)
    assert tb.startswith("Traceback") and "b.py" in tb and "a.py" not in tb
    assert exception_line(tb) == "KeyError: 'k'"
    assert extract_traceback(["no traceback here"]) is None


def test_traceback_with_torch_distributed_rank_prefix():
    # After init_process_group, torch's excepthook prefixes each line with "[rankN]: ".
    lines = [
        "step 3",
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "train.py", line 60, in <module>',
        '[rank1]:     raise RuntimeError("injected")',
        "[rank1]: RuntimeError: injected",
    ]
    text = extract_traceback(lines)
    assert text is not None and text.splitlines()[0] == "Traceback (most recent call last):"
    assert exception_line(text) == "RuntimeError: injected"
