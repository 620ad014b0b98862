"""The conformance runner's verdicts (tests/conformance/runner.py), on recorded outcomes: an
exit stall (ftrun's exit barrier killed a rank that stayed) is a problem even though the job
succeeded with the same output, and runs without their reference are still judged for it."""

from __future__ import annotations

from tests.conformance.runner import Outcome, compare

STALL = (
    "ftrun: rank 0 exited 0 but rank 1 on localhost did not exit within 15 s; stacks taken, "
    "killed. The work was done: succeeded (incident 1 has their stacks)\n"
)


def _outcome(mode: str, output: str = "") -> Outcome:
    return Outcome(mode, 0, {0: ["done"], 1: ["done"]}, [], output)


def test_an_exit_stall_is_a_problem_though_the_output_matches():
    outcomes = [_outcome("warm", "[rank0]: CONF r0 a0 done\n" + STALL), _outcome("torchrun")]
    assert outcomes[0].stalled and not outcomes[1].stalled
    problems, anchor = compare(outcomes, killed=False)
    assert problems == ["warm: exit stall (a rank stayed until the exit barrier)"]
    assert anchor == []


def test_without_the_reference_only_hangs_and_stalls_are_judged():
    outcomes = [_outcome("warm", STALL), _outcome("warm"), Outcome("warm", None)]
    problems, _ = compare(outcomes, killed=False)
    assert problems == [
        "warm: exit stall (a rank stayed until the exit barrier)",
        "warm: hung (no exit within the deadline)",
    ]


def test_plain_torchrun_has_no_exit_barrier_to_quote():
    assert not _outcome("torchrun", STALL).stalled
