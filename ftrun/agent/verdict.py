"""A hang verdict from evidence, this host's half. Pure: the caller passes the samples and clock.

A rank past its allowance (hang.py) is only suspected. What it is doing decides:

  section     the overdue rank is in a section it declared (ftrun.section) and is past that
              section's own timeout: the script said how long it may take.
  stopped     a live rank here is stopped (SIGSTOP, `kill -STOP`, a debugger), seen in two
              samples: a hang at once, once any rank here is past its base allowance. The
              stopped rank is the culprit, whether or not it is the one that stopped stepping.
  spinning    the overdue rank itself computes (uses CPU) past max(its allowance, busy floor):
              a loop that never ends. The first evaluation or final save is not learned yet,
              so the floor is generous (HangPolicy.busy_floor_s).
  waiting     the overdue rank uses no CPU: it waits, most likely in a collective for a peer.
              While any rank of the job computes, that is no hang. When every rank of the job
              has waited for `confirm_s` together, nobody computes what the others wait for: a
              deadlock. This host says so (an `idle` report with `overdue`); the controller
              decides once every host has (controller/stall.py).

At exit, one known deadlock in torch (2.13, gloo; pytorch#56297): the main thread frees DDP's
Reducer while holding the GIL, and ProcessGroupGloo's destructor joins a gloo worker that waits
for the GIL to drop a Python object its finished work holds. The process never exits; its code
is done. `gloo_exit_race` reads it off a native stack dump (py-spy --native): a rank idle at the
end of a job whose dump shows both halves is ended by the exit rules at once, not after the
exit barrier's full timeout.

And once the stacks are in, a rank in teardown (destroy_process_group, interpreter exit) is no
hang to restart for: it belongs to the exit rules (`in_teardown`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ftrun.agent.hang import HangPolicy, Overdue

STOPPED_STATES = frozenset({"stopped"})  # psutil's "T"; "tracing-stop" is py-spy reading it

# Frames that only a rank leaving its training behind is in: the process group going down, the
# interpreter finalizing (threading._shutdown joins non-daemon threads; atexit handlers).
_TEARDOWN = re.compile(
    r"\b(destroy_process_group|_shutdown|_run_exitfuncs|_python_exit|atexit_callback|Py_Finalize\w*)\b"
)


@dataclass(frozen=True)
class Found:
    """A local verdict: `culprit` is hung, for the reason `why` (section, stopped, spinning)."""

    culprit: Overdue
    why: str
    overdue: list[Overdue]


def local_verdict(
    overdue_base: list[Overdue],
    overdue: list[Overdue],
    *,
    stopped: Iterable[int],
    busy: set[int],
    now: float,
    policy: HangPolicy,
) -> Found | None:
    """`overdue_base`: ranks past their base allowance; `overdue`: past the learned one (both
    as ProgressTracker.overdue gives them); `stopped`: live ranks seen stopped twice in a row;
    `busy`: ranks that used CPU (or wrote output, or were runnable) at the last sample."""
    stopped = sorted(stopped)
    if stopped and overdue_base:
        first = stopped[0]
        culprit = next((o for o in overdue_base if o.rank == first), None)
        if culprit is None:  # stopped before it was due: named after itself, not a waiter
            o = overdue_base[0]
            culprit = Overdue(first, None, o.last_progress_t, o.allowance_s, None, o.allowance_s)
        return Found(culprit, "stopped", overdue_base)
    for o in overdue:
        if o.section is not None:
            return Found(o, "section", overdue)
    for o in overdue:
        if o.rank in busy and now - o.last_progress_t > max(o.allowance_s, policy.busy_floor_s):
            return Found(o, "spinning", overdue)
    return None


def gloo_exit_race(native_stacks: str) -> bool:
    """Both halves of torch's gloo destructor deadlock in one process's native dump: a thread
    joining in ~ProcessGroupGloo, and a thread waiting for the GIL in ~ThreadLocalState."""
    return all(
        marker in native_stacks
        for marker in ("~ProcessGroupGloo", "join", "gil_scoped_acquire", "~ThreadLocalState")
    )


def in_teardown(stacks: Mapping[str, str] | Mapping[int, str]) -> list[str]:
    """The ranks (as text) whose stacks show teardown."""
    return sorted(str(r) for r, text in stacks.items() if _TEARDOWN.search(text or ""))
