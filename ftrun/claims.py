"""The claim a generation lays on a directory it keeps checkpoints in: the file and its format.

Ranks write it (ftrun/checkpoint/fence.py: a newer generation's claim refuses an older one's
writes, docs/fencing.md). The agent reads it before it removes a host's memory tier on the way
out: a tier that a newer generation has claimed is in use by it (where hosts share /dev/shm:
several agents of the job on one machine), and an agent of an older generation must not take it away.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CLAIM_FILE = ".generation"


@dataclass(frozen=True)
class Claim:
    """Who owns a directory: a job and its generation."""

    job: str
    generation: int

    def encode(self) -> bytes:
        return f"{self.generation} {self.job}\n".encode()

    @classmethod
    def decode(cls, data: bytes) -> Claim | None:
        """None for an empty or unreadable file (never claimed, or a torn first write)."""
        try:
            gen, _, job = data.decode("ascii").strip().partition(" ")
            return cls(job, int(gen))
        except (UnicodeDecodeError, ValueError):
            return None


def read_claim(directory: Path) -> Claim | None:
    """The claim on a directory, None if there is none or it cannot be read (never through a
    link, never blocking on a FIFO)."""
    try:
        fd = os.open(
            directory / CLAIM_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        )
    except OSError:
        return None
    try:
        return Claim.decode(os.pread(fd, 256, 0))
    except OSError:
        return None
    finally:
        os.close(fd)
