"""A rank that uses multiprocessing itself, with the spawn and forkserver start methods (both
start a fresh interpreter that re-imports this file as __mp_main__)."""

import multiprocessing as mp

import torch.distributed as dist
from _conf import maybe_die, say


def cube(x: int) -> int:
    return x**3


def main() -> None:
    dist.init_process_group("gloo")
    for step in range(3):
        maybe_die(step)
        dist.barrier()
    results = {}
    for method in ("spawn", "forkserver"):
        with mp.get_context(method).Pool(2) as pool:
            results[method] = sum(pool.map(cube, range(10)))
    say("pools", results)


if __name__ == "__main__":
    main()
