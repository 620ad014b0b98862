"""The restore's checks, pure: the sampled digest of a memory snapshot (sample_digest.py) and
the fault policy's `restore rejected` (controller/policy.py)."""

from __future__ import annotations

import pytest
import torch

from ftrun.checkpoint import sample_digest, slots
from ftrun.checkpoint.restore import allowed
from ftrun.controller.evidence import Evidence
from ftrun.controller.policy import RESTORE_REJECTED, History, Tier, classify


def snapshot() -> tuple[torch.Tensor, list[tuple[int, int]]]:
    tensors = [("w", torch.randn(512, 512)), ("b", torch.randn(3)), ("e", torch.randn(70_000))]
    entries, size = slots.layout(tensors)
    base = torch.zeros(size, dtype=torch.uint8)
    for (_, t), e in zip(tensors, entries, strict=True):
        slots.entry_view(base, e).copy_(t)
    return base, sample_digest.spans_of(entries)


def test_an_unchanged_snapshot_passes_and_a_changed_or_torn_one_does_not():
    base, spans = snapshot()
    want = sample_digest.compute(base, spans)
    assert sample_digest.mismatch(base, spans, want) is None
    for offset, _ in spans:  # every tensor's first row is in the sample: a small one too
        changed = base.clone()
        changed[offset] ^= 1
        assert "digest check" in (sample_digest.mismatch(changed, spans, want) or "")
    whole = base.clone()
    whole[spans[0][0] : spans[0][0] + spans[0][1]].view(torch.float32).mul_(0.5)  # an update
    assert sample_digest.mismatch(whole, spans, want) is not None
    torn = base[: spans[-1][0] + 100]
    assert "torn" in (sample_digest.mismatch(torn, spans, want) or "")
    assert "no digest" in (sample_digest.mismatch(base, spans, None) or "")


def test_the_sample_is_a_small_part_of_the_state():
    base, spans = snapshot()
    rows = sample_digest.compute(base, spans)["rows"]
    assert rows * sample_digest.ROW * 64 < base.numel()


def crash(step: int | None) -> Evidence:
    return Evidence(
        kind="crash", host="h", rank=0, exit_code=1, exception="FloatingPointError: NaN", step=step
    )


@pytest.mark.parametrize(
    ("restored", "previous_restored", "used", "tier", "rule", "before"),
    [
        # twice right after restoring step 5: rejected, the next generation restores older
        (5, 5, 1, Tier.RESTART_IN_PLACE, RESTORE_REJECTED, 5),
        # charged to the budget: with none left it is fatal
        (5, 5, 3, Tier.FATAL, "restart budget", None),
        # after restores of different steps (the rejection already went back): fatal
        (4, 5, 2, Tier.FATAL, "same failure twice", None),
        # no restore (a fresh start twice), or nothing to restore: fatal as before
        (None, None, 1, Tier.FATAL, "same failure twice", None),
        (0, 0, 1, Tier.FATAL, "same failure twice", None),
    ],
)
def test_the_same_failure_twice_right_after_a_restore_rejects_it(
    restored, previous_restored, used, tier, rule, before
):
    decision = classify(
        crash(None),
        History(
            restarts_used=used,
            ever_progressed=True,
            previous=crash(None),
            restored_step=restored,
            previous_restored_step=previous_restored,
        ),
        max_restarts=3,
    )
    assert (decision.tier, decision.rule, decision.restore_before) == (tier, rule, before)


def test_a_failure_with_progress_in_between_is_no_rejection():
    decision = classify(
        crash(9),
        History(
            restarts_used=1,
            ever_progressed=True,
            previous=crash(6),
            progressed_since_previous=True,
            restored_step=5,
            previous_restored_step=5,
        ),
        max_restarts=3,
    )
    assert (decision.tier, decision.restore_before) == (Tier.RESTART_IN_PLACE, None)


def test_ranks_restore_no_step_at_or_after_the_rejected_one():
    assert [allowed(s, 5) for s in (3, 4, 5, 6)] == [True, True, False, False]
    assert allowed(7, None)
