"""What the controller hands outward: the `Reporter` its output for people goes to, and the
`JobOutcome` a job ends with.

Its own module so that the supervisor and the parts it builds (fleet, generation, internal)
all import these from one place below them, instead of importing them back from the supervisor.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Protocol

from ftrun.errors import EXIT_INTERRUPTED, EXIT_JOB_FAILED, EXIT_OK, EXIT_PREEMPTED


class Reporter(Protocol):
    """Where the controller's output goes for people (the CLI renders it)."""

    def rank_output(self, rank: int, lines: list[str]) -> None: ...
    def torchrun_output(self, host: str, lines: list[str]) -> None: ...
    def notice(self, text: str, *, level: str = "info") -> None: ...


class OutcomeState(str, enum.Enum):
    """How a job ended. The values are what the journal, `status` and `inspect` show."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    # A preemption notice (Slurm's --signal): the ranks got to commit a checkpoint, then the
    # job stopped; "requeued" when it then went back into Slurm's queue to resume.
    PREEMPTED = "preempted"
    REQUEUED = "requeued"

    def __str__(self) -> str:  # in messages, the word people read ("failed"), not the member
        return self.value


@dataclass(frozen=True)
class JobOutcome:
    state: OutcomeState
    exit_code: int
    reason: str
    root_cause: dict[str, Any] | None = None

    @classmethod
    def succeeded(cls, reason: str) -> JobOutcome:
        return cls(OutcomeState.SUCCEEDED, EXIT_OK, reason)

    @classmethod
    def failed(
        cls,
        reason: str,
        root_cause: dict[str, Any] | None = None,
        *,
        exit_code: int = EXIT_JOB_FAILED,
    ) -> JobOutcome:
        return cls(OutcomeState.FAILED, exit_code, reason, root_cause)

    @classmethod
    def stopped(cls, reason: str = "stopped by a signal") -> JobOutcome:
        return cls(OutcomeState.STOPPED, EXIT_INTERRUPTED, reason)

    @classmethod
    def preempted(cls, reason: str, *, requeue: bool) -> JobOutcome:
        state = OutcomeState.REQUEUED if requeue else OutcomeState.PREEMPTED
        return cls(state, EXIT_PREEMPTED, reason)
