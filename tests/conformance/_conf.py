"""The conformance runner's side of each corpus script: one deterministic fault, and marked
output. Kept tiny on purpose: the scripts around it are ordinary torchrun scripts.

- `say(...)` prints `CONF r<rank> a<attempt> ...` on stdout, the lines the runner compares.
- `attempt()` is how many times this job has been (re)started, counted in files under
  $CONF_DIR, not from any launcher's variables, so all three launchers count alike.
- `maybe_die(step)` SIGKILLs this rank at `$CONF_KILL=rank:step`, once per job.
"""

import os
import signal
import sys

RANK = int(os.environ.get("RANK", "0"))
DIR = os.environ.get("CONF_DIR", ".")


# Read once, at start: the rank that dies creates the file while the others still print.
ATTEMPT = 1 if os.path.exists(os.path.join(DIR, "killed")) else 0


def attempt() -> int:
    return ATTEMPT


def say(*parts: object) -> None:
    # One write per line, so that ranks sharing a console never interleave within a line.
    sys.stdout.write(" ".join([f"CONF r{RANK} a{attempt()}", *map(str, parts)]) + "\n")
    sys.stdout.flush()


def maybe_die(step: int) -> None:
    if os.environ.get("CONF_KILL") == f"{RANK}:{step}" and attempt() == 0:
        open(os.path.join(DIR, "killed"), "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
