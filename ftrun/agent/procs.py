"""Process-group hygiene for the agent: signal whole groups, escalate to SIGKILL, make sure.

Everything the agent starts carries FTRUN_AGENT_ID in its environment (forks of the zygote keep
the zygote's original environment block, which has it too), so a final sweep finds anything that
escaped its process group, such as a grandchild that called setsid().
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterable

import psutil

from ftrun import envcontract, terms
from ftrun.errors import EXIT_SUPERSEDED


def killpg_quietly(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def tagged_processes(agent_id: str, *, exclude: Iterable[int] = ()) -> list[psutil.Process]:
    """Processes whose environment carries FTRUN_AGENT_ID=agent_id."""
    return _tagged(lambda tag: tag == agent_id, exclude)


def job_processes(job_id: str) -> list[psutil.Process]:
    """Processes of any agent of job `job_id` on this machine: their tag is `job/agent`
    (Bootstrap.process_tag)."""
    return _tagged(lambda tag: tag.startswith(f"{job_id}/"), ())


def _tagged(wanted: Callable[[str], bool], exclude: Iterable[int]) -> list[psutil.Process]:
    skip = {os.getpid(), *exclude}
    found = []
    for proc in psutil.process_iter():
        if proc.pid in skip:
            continue
        try:
            tag = proc.environ().get(envcontract.AGENT_ID)
        except (psutil.Error, OSError):
            continue
        if tag is not None and wanted(tag):
            found.append(proc)
    return found


def kill_all(
    pgids: Iterable[int], agent_id: str, *, exclude: Iterable[int] = (), timeout_s: float = 5.0
) -> list[int]:
    """SIGKILL the groups and every tagged straggler; wait until they are gone.
    Returns the pids still alive at the deadline (empty when all is well)."""
    for pgid in set(pgids):
        killpg_quietly(pgid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    survivors = _alive(tagged_processes(agent_id, exclude=exclude))
    while survivors and time.monotonic() < deadline:
        for proc in survivors:
            try:
                proc.kill()
            except psutil.Error:
                pass
        time.sleep(0.01)
        survivors = _alive(survivors)
    return [p.pid for p in survivors]


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Processes neither gone nor zombies (a zombie is dead; its parent reaps it)."""
    alive = []
    for proc in procs:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    return alive


def main(argv: list[str]) -> int:
    """`python -m ftrun.agent.procs AGENT_ID [TERM]`: the launcher's last resort on a host whose
    agent did not exit when told (run over a fresh ssh session): kill everything tagged with the
    id; unless a controller of a newer term than TERM leads the job here (ftrun/terms.py)."""
    if len(argv) not in (1, 2) or (len(argv) == 2 and not argv[1].isdigit()):
        print("usage: python -m ftrun.agent.procs AGENT_ID [TERM]", file=sys.stderr)
        return 2
    if len(argv) == 2 and terms.superseded(argv[0].split("/")[0], int(argv[1])):
        print(f"not swept: a controller newer than term {argv[1]} leads the job", file=sys.stderr)
        return EXIT_SUPERSEDED
    survivors = kill_all([], argv[0])
    if survivors:
        print(f"survived SIGKILL: {survivors}", file=sys.stderr)
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
