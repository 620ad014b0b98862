"""The FtrunError hierarchy: every error a user can cause carries a message, a hint and an exit code.

The CLI catches FtrunError at its boundary, prints message and hint on one screen line each and
exits with the code; a traceback appears only with FTRUN_DEBUG=1.
"""

from __future__ import annotations

from typing import Any

# Exit codes. 2 is "you asked for something wrong" (as click/argparse use it); the job exit
# codes below mirror what a batch system should read from a finished job.
EXIT_OK = 0
EXIT_JOB_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
# Stopped by a preemption notice or time limit after its checkpoint was committed: not a failure,
# resubmitting (or Slurm's requeue) continues it. EX_TEMPFAIL: "try again later". A job that
# failed for good exits EXIT_JOB_FAILED instead, which must never be requeued (docs/slurm.md).
EXIT_PREEMPTED = 75
# An agent's own exit status (its process on a host, not the job's): what its log and its
# transport see. Fenced: it lost the controller (silence, a closed connection or stdin, a signal)
# and killed everything it started, so a partitioned host never trains on. Agent error: one of
# its own tasks failed for good (tasks.py); the controller has the reason in its journal.
EXIT_FENCED = 3
EXIT_AGENT_ERROR = 4
# Superseded: a newer controller (a standby that took the job over) leads the job on that host,
# so what this one asked (start an agent, sweep one) was refused there (ftrun/terms.py).
EXIT_SUPERSEDED = 5


class FtrunError(Exception):
    """An error with a user-facing message, a hint for what to do next, and an exit code."""

    exit_code: int = EXIT_JOB_FAILED

    def __init__(
        self,
        message: str,
        *,
        hint: str = "",
        data: dict[str, Any] | None = None,
        exit_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.data = data or {}
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(FtrunError):
    """Bad input: a wrong flag, a missing script, an unknown job id, a busy port."""

    exit_code = EXIT_USAGE


class HostUnreachable(FtrunError):
    """A transport could not start an agent on a host: the message carries the transport's own
    error (ssh's, the exec's), the hint the command to try by hand."""

    def __init__(self, host: str, error: str, *, via: str = "", hint: str = "") -> None:
        super().__init__(f"cannot reach {host}{f' {via}' if via else ''}: {error}", hint=hint)
        self.host = host
        self.error = error


class ProtocolError(Exception):
    """A control-plane message that is malformed, unauthenticated, oversized or stale.

    Not an FtrunError: it never reaches a user. Receivers drop the message and log why.
    """
