"""torchrun's values, read as torchrun reads them (torch/distributed/run.py): --nnodes N or
MIN:MAX, --nproc-per-node N|gpu|cpu|auto, the --redirects/--tee stream specs and
--local-ranks-filter, and what the console shows of each rank by them.

Pure, but for counting devices: torch is imported only for gpu, xpu and auto. Problems are
collected into the caller's list (cli/launch_inputs.py's way), never raised.
"""

from __future__ import annotations

import dataclasses
import os
import re

from rich.console import Console

from ftrun.cli.render import ConsoleReporter


def parse_nnodes(text: str, problems: list[str]) -> tuple[int, int] | None:
    """torchrun's --nnodes: N (MIN = MAX = N) or MIN:MAX, with 0 < MIN <= MAX."""
    parts = text.split(":")
    try:
        if len(parts) > 2:
            raise ValueError
        low, high = int(parts[0]), int(parts[-1])
    except ValueError:
        problems.append(f"--nnodes {text!r} is not N or MIN:MAX (whole numbers)")
        return None
    if low < 1:
        problems.append(f"--nnodes {text}: a job has at least 1 node")
        return None
    if low > high:
        problems.append(f"--nnodes {text}: MIN ({low}) is more than MAX ({high})")
        return None
    return low, high


NPROC_WORDS = ("gpu", "cpu", "auto", "xpu")


def nproc_per_node_of(text: str | None, *, gpus: int | None, problems: list[str]) -> int | None:
    """--nproc-per-node as torchrun takes it: N, or gpu (CUDA devices; torchrun stops without
    CUDA), xpu, cpu (the CPUs this process may run on) or auto (an accelerator's devices, else
    the CPUs). Counted on this machine; `gpus`: the GPUs per node a Slurm allocation gives,
    which count for `gpu` and `auto` instead. None when not given."""
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        pass
    word = text.strip().lower()
    if word not in NPROC_WORDS:
        problems.append(f"--nproc-per-node {text!r} is not a number of ranks, nor gpu/cpu/auto")
        return None
    if word in ("gpu", "auto") and gpus:
        return gpus
    if word == "cpu":
        return _cpu_count()
    import torch  # only here: the launcher needs torch for nothing else

    if word == "auto":
        accelerator = getattr(torch, "accelerator", torch.cuda)  # torch.accelerator: 2.6+
        return int(accelerator.device_count()) if accelerator.is_available() else _cpu_count()
    device = torch.cuda if word == "gpu" else torch.xpu
    if not device.is_available():
        name = "CUDA" if word == "gpu" else "XPU"
        problems.append(
            f"--nproc-per-node {word}: {name} is not available on this machine, where ftrun "
            f"counts the devices (torchrun stops too: {name.title()} is not available)"
        )
        return None
    return int(device.device_count())


def _cpu_count() -> int:
    """torch._utils.cpu_count, as torchrun counts: the CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


# torchrun's std streams flags (torch.distributed.elastic.multiprocessing.api.Std): 0 none,
# 1 stdout, 2 stderr, 3 both; one value for every local rank or `local_rank:value,...`.
_STD_ONE = re.compile(r"[0-3]")
_STD_MAP = re.compile(r"(\d:[0-3],)*(\d:[0-3])")


@dataclasses.dataclass(frozen=True)
class Std:
    """A --redirects/--tee value: the streams for each local rank (those not named: none)."""

    every: int = 0
    ranks: tuple[tuple[int, int], ...] = ()

    def of(self, local_rank: int) -> int:
        return dict(self.ranks).get(local_rank, self.every)

    def values(self) -> set[int]:
        return {self.every, *(v for _, v in self.ranks)}


def parse_std(flag: str, text: str, problems: list[str]) -> Std:
    if _STD_ONE.fullmatch(text):
        return Std(every=int(text))
    if _STD_MAP.fullmatch(text):
        return Std(
            ranks=tuple((int(r), int(v)) for r, v in (m.split(":") for m in text.split(",")))
        )
    problems.append(
        f"{flag} {text!r} is not 0-3 (none, stdout, stderr, both) or local_rank:value,..."
    )
    return Std()


@dataclasses.dataclass(frozen=True)
class Echo:
    """What the console shows of each local rank's output, as torchrun's --local-ranks-filter,
    --redirects and --tee would. The rank's log has all of it either way."""

    shown: frozenset[int] | None = None  # --local-ranks-filter; None: every local rank
    redirects: Std = Std()
    tee: Std = Std()

    def shows(self, local_rank: int) -> bool:
        if self.shown is not None and local_rank not in self.shown:
            return False
        # Off the console only when both streams are redirected and neither is teed: ftrun's
        # log holds the two streams as one.
        return not (self.redirects.of(local_rank) == 3 and self.tee.of(local_rank) == 0)


class EchoingReporter(ConsoleReporter):
    """The console reporter showing only the ranks `echo` shows (by local rank: ranks are
    numbered host by host, `nproc_per_node` on each)."""

    def __init__(self, console: Console, echo: Echo, nproc_per_node: int) -> None:
        super().__init__(console)
        self.echo = echo
        self.nproc_per_node = nproc_per_node

    def rank_output(self, rank: int, lines: list[str]) -> None:
        if self.echo.shows(rank % self.nproc_per_node):
            super().rank_output(rank, lines)
