from __future__ import annotations

import pytest

from ftrun.controller.evidence import Evidence
from ftrun.controller.policy import History, Tier, classify
from ftrun.controller.policy_file import load_policy
from ftrun.errors import UsageError

GOOD = """
[[rules]]
name = "exit 7 means bad data"
exit_codes = [7]
tier = "fatal"

[[rules]]
name = "flaky storage"
log = "Stale file handle"
tier = "restart-in-place"

[quarantine]
failures = 2
window_s = 60

[hang]
startup_timeout_s = 90
floor_s = 3
"""


def test_user_rules_come_first(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(GOOD)
    policy = load_policy(path)
    assert policy.quarantine.failures == 2 and policy.quarantine.expiry_s == 3600
    assert policy.hang.startup_timeout_s == 90 and policy.hang.expect_progress
    ev = Evidence(kind="crash", rank=0, exit_code=7, step=5)
    decision = classify(ev, History(ever_progressed=True), max_restarts=3, rules=policy.rules)
    assert decision.tier is Tier.FATAL and decision.rule == "exit 7 means bad data"
    ev = Evidence(kind="crash", rank=0, exit_code=1, log_tail=("OSError: Stale file handle",))
    assert (
        classify(ev, History(ever_progressed=True), max_restarts=3, rules=policy.rules).rule
        == "flaky storage"
    )


@pytest.mark.parametrize(
    "text, needles",
    [
        ("[[rules]]\ntier = 'sometimes'\n", ["tier must be one of"]),
        (
            "[[rules]]\ntier = 'fatal'\nlog = '('\nkinds = ['meteor']\n",
            ["not a valid regex", "kinds"],
        ),
        ("[quarantine]\nfailures = -1\nbogus = 1\n", ["non-negative", "unknown key"]),
        ("[surprise]\n", ["unknown section"]),
        ("this is = not toml =", ["not valid TOML"]),
    ],
)
def test_bad_policy_files_report_every_problem(tmp_path, text, needles):
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(UsageError) as e:
        load_policy(path)
    for needle in needles:
        assert needle in e.value.message


def test_missing_policy_file(tmp_path):
    with pytest.raises(UsageError, match="no policy file"):
        load_policy(tmp_path / "nope.toml")
