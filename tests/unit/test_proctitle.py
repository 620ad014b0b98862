"""A warm rank's command line and environment as /proc shows them (ftrun/agent/proctitle.py).
The rewrites act on the calling process's own memory, so each case runs in a child interpreter
that starts the way the zygote does: with room reserved in argv and the environment."""

from __future__ import annotations

import json
import subprocess
import sys

from ftrun.agent import proctitle

CHILD = """
import json, os, sys
from ftrun.agent import proctitle
case = sys.argv[1]
if case != "libc-still-points":
    os.environ.clear()  # what as_main.prepare() does: libc's environ moves to the heap
    os.environ.update({"RANK": "1", "WORLD_SIZE": "4", "ODD": "a b=c"})
if case == "too-big":
    os.environ["HUGE"] = "x" * (proctitle.ENV_ROOM_BYTES * 2)
ok = proctitle.set_environ(os.environb)
titled = proctitle.set_title(proctitle.rank_title(os.environ, ["train.py", "--lr", "3"]))
with open("/proc/self/environ", "rb") as f:
    env = f.read()
with open("/proc/self/cmdline", "rb") as f:
    cmdline = f.read()
print(json.dumps({"ok": ok, "titled": titled, "env": env.decode(), "cmdline": cmdline.decode()}))
"""


def _child(case: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", CHILD, case, proctitle.title_room()],
        env={"PATH": "/usr/bin:/bin", "KEEP": "zygote", **proctitle.env_room()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    out: dict = json.loads(result.stdout)
    return out


def test_a_rank_title_names_the_rank_then_the_script_and_its_arguments():
    env = {"RANK": "3", "WORLD_SIZE": "8"}
    assert proctitle.rank_title(env, ["train.py", "--lr", "3e-4"]) == (
        "ftrun rank 3/8 train.py --lr 3e-4"
    )
    assert proctitle.rank_title(env, ["pkg.train", "x"], module=True) == (
        "ftrun rank 3/8 -m pkg.train x"
    )
    assert proctitle.rank_title({}, ["t.py"]) == "ftrun rank ?/? t.py"


def test_proc_shows_the_new_environment_and_title():
    seen = _child("fits")
    assert seen["ok"] and seen["titled"]
    entries = [e for e in seen["env"].split("\0") if e]
    assert entries == ["RANK=1", "WORLD_SIZE=4", "ODD=a b=c"]
    assert seen["env"].endswith("\0\0")  # the rest of the area: NULs, which end the block
    assert seen["cmdline"].split("\0")[0] == "ftrun rank 1/4 train.py --lr 3"


def test_an_environment_that_does_not_fit_leaves_the_old_block():
    seen = _child("too-big")
    assert not seen["ok"]
    assert "KEEP=zygote" in seen["env"].split("\0")


def test_the_block_is_left_alone_while_libc_still_reads_it():
    """Before os.environ is replaced, libc's environ points into the area: getenv() would
    return the new bytes, so nothing is written."""
    seen = _child("libc-still-points")
    assert not seen["ok"]
    assert "KEEP=zygote" in seen["env"].split("\0")
