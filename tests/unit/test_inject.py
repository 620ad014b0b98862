from ftrun.agent.inject import take_due


def test_requests_wait_for_their_step_and_their_rank():
    pending = [
        {"action": "kill-rank", "rank": 1, "at_step": 10},
        {"action": "hang-rank", "rank": 2},
        {"action": "freeze-agent", "at_step": 5},
    ]
    assert take_due(pending, {0: 4, 1: 4}, {0: 100, 1: 101}) == []
    due = take_due(pending, {0: 6, 1: 10}, {0: 100, 1: 101})
    assert [d["action"] for d in due] == ["kill-rank", "freeze-agent"]
    assert [d["action"] for d in pending] == ["hang-rank"]  # rank 2 has not started
    assert take_due(pending, {}, {2: 102})[0]["action"] == "hang-rank" and pending == []


def test_a_named_rank_that_reports_no_step_goes_by_its_hosts_step():
    """Steps parsed from a line only rank 0 prints: "rank 1 at step 10" is the job's step 10."""
    pending = [{"action": "kill-rank", "rank": 1, "at_step": 10}]
    assert take_due(pending, {0: 9}, {0: 100, 1: 101}) == []
    assert take_due(pending, {0: 10}, {0: 100, 1: 101})[0]["rank"] == 1 and pending == []
    pending = [{"action": "kill-rank", "rank": 1, "at_step": 10}]
    assert take_due(pending, {0: 12, 1: 9}, {0: 100, 1: 101}) == []  # its own step rules
