from __future__ import annotations

from ftrun.agent.tail import GenerationLogs, exception_line, extract_traceback


def test_follows_rank_files_and_progress(tmp_path):
    logs = GenerationLogs(tmp_path, r"step (\d+)")
    (tmp_path / "rank0.log").write_text("step 1\nstep 2\npart")
    assert logs.poll() == {0: ["step 1", "step 2"]}
    with open(tmp_path / "rank0.log", "a") as f:
        f.write("ial line\n")
    assert logs.poll() == {0: ["partial line"]}
    assert logs.last_step(["step 3", "noise", "step 10"]) == 10
    assert logs.tail(0)[-1] == "partial line"


def test_extracts_the_last_traceback():
    lines = ["noise", "Traceback (most recent call last):", '  File "a.py", line 1, in <module>',
             "    f()", "ValueError: first", "Traceback (most recent call last):",
             '  File "b.py", line 2, in <module>', "KeyError: 'k'", "after"]
    tb = extract_traceback(lines)
    assert tb.startswith("Traceback") and "b.py" in tb and "a.py" not in tb
    assert exception_line(tb) == "KeyError: 'k'"
    assert extract_traceback(["no traceback here"]) is None


def test_traceback_with_torch_distributed_rank_prefix():
    # After init_process_group, torch's excepthook prefixes each line with "[rankN]: ".
    lines = ["step 3", "[rank1]: Traceback (most recent call last):",
             '[rank1]:   File "train.py", line 60, in <module>',
             '[rank1]:     raise RuntimeError("injected")', "[rank1]: RuntimeError: injected"]
    text = extract_traceback(lines)
    assert text is not None and text.splitlines()[0] == "Traceback (most recent call last):"
    assert exception_line(text) == "RuntimeError: injected"
