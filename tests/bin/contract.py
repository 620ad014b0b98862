"""Prints the torchrun contract as this rank sees it, as one `CONTRACT {json}` line. With
--fail-once MARKER, rank 1 SIGKILLs itself the first time (so that a generation 2 exists);
--names adds variables to print (what --env and --env-file forward), --exec-names variables as
/proc/self/environ shows them (what the interpreter and the dynamic loader read; a warm rank's
rewritten to its own, though the glibc tunables came from the zygote's start); --wait-for FILE
keeps the rank alive until FILE exists (at most 180 s), for a test to look at the running processes."""

import argparse
import json
import os
import signal
import sys
import time

KEYS = [
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE",
    "FTRUN_GENERATION",
    "FTRUN_JOB_ID",
]

p = argparse.ArgumentParser()
p.add_argument("--fail-once", default=None, help="marker file: rank 1 dies if it does not exist")
p.add_argument("--names", nargs="*", default=[])
p.add_argument("--exec-names", nargs="*", default=[])
p.add_argument("--wait-for", default=None)
args = p.parse_args()
first_generation = bool(args.fail_once) and not os.path.exists(args.fail_once)
seen = {k: os.environ.get(k) for k in KEYS + args.names}
if args.exec_names:
    with open("/proc/self/environ", "rb") as f:
        started = dict(
            item.decode().split("=", 1) for item in f.read().split(b"\0") if b"=" in item
        )
    seen["exec"] = {k: started.get(k) for k in args.exec_names}
print("CONTRACT " + json.dumps(seen), flush=True)
if first_generation:
    open(f"{args.fail_once}.rank{os.environ['RANK']}", "w").close()  # printed
if first_generation and os.environ["RANK"] == "1":
    # Every rank of this generation has printed before rank 1 dies: on a loaded machine rank 3
    # had not yet when only rank 0 was waited for, so it printed in generation 2 alone.
    printed = [f"{args.fail_once}.rank{r}" for r in range(int(os.environ["WORLD_SIZE"]))]
    deadline = time.monotonic() + 60
    while not all(map(os.path.exists, printed)) and time.monotonic() < deadline:
        time.sleep(0.05)
    open(args.fail_once, "w").close()
    os.kill(os.getpid(), signal.SIGKILL)
# Longer than any wait of the tests that use it (up to 120 s for the next generation's lines on
# a loaded machine): a rank that gave up first would fail its generation and start another.
deadline = time.monotonic() + 180
# Rank 0 of the failing generation waits to be torn down: had it exited 0 first, rank 1's death
# would come after the generation's work was done, which ends the job instead of restarting it.
while first_generation and time.monotonic() < deadline:
    time.sleep(0.05)
while args.wait_for and not os.path.exists(args.wait_for):
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.05)
