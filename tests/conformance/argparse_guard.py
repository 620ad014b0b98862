"""argparse behind a __main__ guard; prints what a script may look at about itself."""

import argparse
import os
import sys

import torch.distributed as dist
from _conf import maybe_die, say

import __main__


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="conformance: argparse")
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--tag", default="none")
    return parser.parse_args()


if __name__ == "__main__":
    args = parse()
    dist.init_process_group("gloo")
    for step in range(5):
        maybe_die(step)
        dist.barrier()
    say(
        "lr",
        args.lr,
        "tag",
        args.tag,
        "argv0",
        os.path.basename(sys.argv[0]),
        "file",
        os.path.basename(__main__.__file__),
        "spec",
        __spec__,
        "path0",
        os.path.basename(sys.path[0]),
        "stdin",
        sys.stdin.isatty() or sys.stdin.read(1) == "",
    )
