"""`python -m ftrun.agent`: reads its Bootstrap as one JSON line on stdin, then runs."""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from ftrun.agent import copy_tunables
from ftrun.agent.agent import Agent
from ftrun.bootstrap import Bootstrap


def main() -> int:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s agent %(levelname)s %(message)s"
    )
    line = sys.stdin.buffer.readline()
    try:
        boot = Bootstrap.from_json(line.decode())
    except (ValueError, TypeError) as e:
        print(f"ftrun agent: bad bootstrap on stdin: {e}", file=sys.stderr)
        return 2
    # Before anything is started or written: the zygote, torchrun and the ranks inherit the
    # umask (what they write is 0600/0700, or 0640/0750 with --group-readable), and the
    # environment the launcher forwards.
    os.umask(boot.umask)
    os.environ.update(boot.env)
    if tunables := copy_tunables.apply(os.environ):
        logging.info("ranks start with GLIBC_TUNABLES=%s (copy_tunables.py)", tunables)
    return asyncio.run(Agent(boot).run())


if __name__ == "__main__":
    sys.exit(main())
