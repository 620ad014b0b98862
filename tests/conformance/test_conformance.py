"""A fast subset of the conformance corpus (scripts/conformance.py runs all of it, repeatedly):
ordinary torchrun scripts behave the same under warm ftrun, cold ftrun and plain torchrun."""

from __future__ import annotations

import pytest

from tests.conformance.runner import CORPUS, MODES, Outcome, compare, run_one

# Three shapes in CI (seconds per mode each); scripts/conformance.py runs the whole corpus.
# eval_pause: rank 0 evaluates while the others wait, judged by a progress regex (a false hang
# before hang verdicts needed evidence).
FAST = ("ddp_no_destroy", "uncaught", "eval_pause")
# Unkilled warm runs that already passed the comparison with plain torchrun, by script name:
# the killed-rank test's reference is the very same run (same script, mode and arguments; the
# script is deterministic), so it is not run a second time when this session already has it.
CHECKED_WARM: dict[str, Outcome] = {}


@pytest.mark.parametrize("name", FAST)
def test_script_behaves_as_under_torchrun(name, test_id, no_survivors):
    script = next(s for s in CORPUS if s.name == name)
    env = {"FTRUN_TEST_ID": test_id}
    outcomes = [run_one(mode, script, killed=False, extra_env=env) for mode in MODES]
    # torch's abort at interpreter exit strikes plain torchrun's ranks as it does cold ftrun's
    # (runner.FINALIZATION_ABORT): the mode that met it runs once more, and must be clean then.
    outcomes = [
        run_one(o.mode, script, killed=False, extra_env=env) if o.finalization_abort else o
        for o in outcomes
    ]
    problems, _ = compare(outcomes, killed=False)
    assert not problems, "\n".join(problems) + "\n\n" + outputs_of(outcomes, problems)
    warm = outcomes[0]
    assert warm.conf or warm.traceback, "the script printed nothing to compare"
    CHECKED_WARM[name] = warm


def outputs_of(outcomes: list[Outcome], problems: list[str]) -> str:
    """The output of each run a problem names, then the reference's: the run that differs is
    the one to read (a cold run's own failure summary says why the job ended as it did)."""
    named = {p.split(":", 1)[0] for p in problems} | {"torchrun", "cold"}  # and the references
    return "\n\n".join(
        f"--- {o.mode} (exit {o.exit_code}, {o.seconds:.1f} s) ---\n{o.output[-3000:]}"
        for o in outcomes
        if o.mode in named
    )


def test_killed_rank_resumes_the_same_losses(test_id, no_survivors):
    """A rank SIGKILLed mid-run: warm and cold ftrun restart the job, the script resumes from
    its checkpoint, and the losses after the resume are the unkilled run's, bit for bit."""
    script = next(s for s in CORPUS if s.name == "ddp_no_destroy")
    env = {"FTRUN_TEST_ID": test_id}
    clean = CHECKED_WARM.get(script.name) or run_one("warm", script, killed=False, extra_env=env)
    assert clean.exit_code == 0 and clean.conf, clean.output[-3000:]
    killed = [run_one(mode, script, killed=True, extra_env=env) for mode in ("warm", "cold")]
    problems, _ = compare(killed, killed=True)
    assert not problems, "\n".join(problems) + "\n\n" + outputs_of(killed, problems)
    for outcome in killed:
        assert outcome.exit_code == 0, outcome.output[-3000:]
        for rank, lines in outcome.conf.items():
            assert lines[0] == "resumed at 5", lines
            resumed = [line for line in lines if line.startswith("step")]
            assert resumed == [line for line in clean.conf[rank] if line.startswith("step")][5:]
