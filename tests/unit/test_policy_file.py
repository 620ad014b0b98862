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


@pytest.mark.parametrize(
    "text, needle",
    [
        ("hang = 5\n", "[hang]: expected a table like [hang] floor_s = 2, got the integer 5"),
        ("quarantine = 'x'\n", "[quarantine]: expected a table like [quarantine] failures = 3"),
        ("timeouts = []\n", "[timeouts]: expected a table like [timeouts] host_lost_timeout_s"),
        ("rules = 5\n", 'rules: expected an array of tables like [[rules]] tier = "fatal"'),
        ("rules = [5]\n", "rules[0]: expected a table like [[rules]]"),
        ("[[rules]]\ntier = 5\n", "rules[0].tier must be one of"),
        ("[[rules]]\ntier = 'fatal'\nname = 5\n", "rules[0].name: expected a string like"),
        ("[[rules]]\ntier = 'fatal'\nkinds = [1]\n", "rules[0].kinds: expected a string or an"),
        ("[[rules]]\ntier = 'fatal'\nsignals = {a = 1}\n", "rules[0].signals: expected"),
        ("[[rules]]\ntier = 'fatal'\nexit_codes = [true]\n", "rules[0].exit_codes: expected"),
        ("[[rules]]\ntier = 'fatal'\nlog = 5\n", "rules[0].log: expected a regex like"),
        ("[quarantine]\nfailures = 1.5\n", "failures: expected a non-negative integer like"),
        ("[hang]\nfloor_s = 'x'\n", "[hang].floor_s: expected a non-negative number of seconds"),
        ("[hang]\nfactor = nan\n", "[hang].factor: expected a non-negative number"),
        ("[hang]\nexpect_progress = 1\n", "[hang].expect_progress: expected true or false"),
        ("[timeouts]\nfence_timeout_s = inf\n", "[timeouts].fence_timeout_s: expected"),
    ],
)
def test_wrong_types_are_named_with_what_was_expected(tmp_path, text, needle):
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(UsageError) as e:
        load_policy(path)
    assert needle in e.value.message
    assert e.value.hint == "see docs/policy.md for the policy file format"


def test_every_type_problem_in_one_message(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text("hang = 5\nquarantine = 'x'\n[[rules]]\ntier = 'fatal'\nname = 5\n")
    with pytest.raises(UsageError) as e:
        load_policy(path)
    assert all(k in e.value.message for k in ("[hang]:", "[quarantine]:", "rules[0].name:"))
