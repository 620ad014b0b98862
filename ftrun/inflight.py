"""How many micro-batches a pipeline rank holds activations for at its peak, per schedule.

One count for the planner (ftrun/planner/cost.py: does a layout fit?) and for the ranks
(ftrun/parallel/memory.py: does this rank's stage fit its budget?), so that a layout the planner
chose is never refused by the rank that runs it. Ground floor: pure, imported by both.

GPipe runs every forward first: M. 1F1B starts backward once the pipeline is full: PP - p (at
most M). Interleaved1F1B with v virtual stages per rank warms up 2(PP - p - 1) + (v - 1)·PP + 1
virtual-stage micro-batches (Megatron-LM's count, at most v·M), each holding one virtual stage's
activations. PP = 1 (no pipeline, gradient accumulation): one at a time.
"""

from __future__ import annotations


def in_flight(schedule: str, *, pp: int, position: int, micro_batches: int, v: int = 1) -> int:
    """Micro-batches (virtual-stage micro-batches for Interleaved1F1B) whose activations
    pipeline rank `position` holds at its peak."""
    if pp == 1:
        return 1
    if schedule == "GPipe":
        return micro_batches * v
    if schedule == "1F1B":
        return min(pp - position, micro_batches)
    if schedule == "Interleaved1F1B":
        return min(2 * (pp - position - 1) + (v - 1) * pp + 1, v * micro_batches)
    raise ValueError(f"unknown schedule {schedule!r}")
