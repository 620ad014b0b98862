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
