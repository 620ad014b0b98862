"""Dies of an exception under torch's `@record`, and keeps the traceback out of its output: the
error file torchrun asked for (TORCHELASTIC_ERROR_FILE) is the only place it goes."""

import sys

from torch.distributed.elastic.multiprocessing.errors import record


class DatasetCorrupt(Exception):
    pass


def open_shard(n: int) -> None:
    raise DatasetCorrupt(f"shard {n} has a bad header")


@record
def main() -> None:
    print("loading shards", flush=True)
    open_shard(17)


if __name__ == "__main__":
    try:
        main()
    except DatasetCorrupt:
        sys.exit(1)  # quietly: no traceback on stderr
