"""main() decorated with torch.distributed.elastic's @record: the error goes to the error file."""

import torch.distributed as dist
from _conf import maybe_die, say
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    dist.init_process_group("gloo")
    for step in range(4):
        maybe_die(step)
        dist.barrier()
    if dist.get_rank() == 1:
        raise ValueError("rank 1 found a NaN")
    say("rank 0 fine")


if __name__ == "__main__":
    main()
