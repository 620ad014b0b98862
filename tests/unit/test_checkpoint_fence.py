"""Generation fences (ftrun/checkpoint/fence.py): a newer generation's claim refuses an older
one's writes, a write in flight holds the claim back until it is complete, and a planted fence
file is refused. The lock is a real flock between real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from ftrun.checkpoint.errors import CheckpointError
from ftrun.checkpoint.fence import GenerationFence, Superseded
from ftrun.claims import CLAIM_FILE, Claim, read_claim


def fence(tmp_path, generation: int, job: str = "job-a", timeout_s: float = 5.0):
    return GenerationFence(tmp_path, job=job, generation=generation, timeout_s=timeout_s)


def test_advance_claims_and_an_older_generation_is_refused(tmp_path):
    old, new = fence(tmp_path, 1), fence(tmp_path, 2)
    assert old.advance() is None  # never claimed before
    with old.hold():
        pass  # its own claim: allowed
    assert new.advance() == Claim("job-a", 1)
    assert (tmp_path / CLAIM_FILE).read_text() == "2 job-a\n"
    assert read_claim(tmp_path) == Claim("job-a", 2)  # what an agent reads before cleaning up
    with pytest.raises(Superseded, match="generation 1 of job job-a .* generation 2 has claimed"):
        old.acquire()
    with pytest.raises(Superseded):
        old.advance()  # a zombie that restarts its Manager cannot take the directory back
    with new.hold():
        pass
    peer = fence(tmp_path, 2)
    assert peer.advance() == Claim("job-a", 2)  # a peer rank of generation 2
    peer.close()
    later = fence(tmp_path, 3)
    with later.hold():  # a newer generation that has not claimed it yet may write
        pass
    for f in (old, new, later):
        f.close()


def test_another_job_takes_the_directory_over(tmp_path):
    """A new job reusing a checkpoint directory starts its own count; the old job's writes are
    refused from then on, whatever their generation."""
    first = fence(tmp_path, 7, job="job-a")
    first.advance()
    second = fence(tmp_path, 1, job="job-b")
    assert second.advance() == Claim("job-a", 7)
    with pytest.raises(Superseded, match="job job-b has claimed"):
        first.acquire()
    first.close()
    second.close()


def test_garbage_in_the_fence_file_counts_as_unclaimed(tmp_path):
    (tmp_path / CLAIM_FILE).write_bytes(b"\xff\xfe not a claim")
    f = fence(tmp_path, 4)
    with f.hold():
        pass
    assert f.advance() is None
    assert (tmp_path / CLAIM_FILE).read_text() == "4 job-a\n"
    f.close()


def test_a_planted_link_is_refused_and_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / CLAIM_FILE).symlink_to(victim)
    f = fence(tmp_path, 1)
    with pytest.raises(CheckpointError, match="cannot use the generation fence"):
        f.advance()
    assert victim.read_text() == "precious"
    assert read_claim(tmp_path) is None  # the agent does not follow it either
    f.close()


HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from ftrun.checkpoint.fence import GenerationFence, Superseded
    f = GenerationFence(Path(sys.argv[1]), job="job-a", generation=1, timeout_s=5)
    f.acquire()
    print("held", flush=True)
    sys.stdin.readline()
    f.release()
    print("released", flush=True)
    sys.stdin.readline()
    try:
        f.acquire()
        print("acquired", flush=True)
    except Superseded:
        print("superseded", flush=True)
    """
)


def test_a_write_in_flight_holds_the_next_generation_back(tmp_path):
    """While a process of generation 1 holds the fence (a commit or a snapshot copy in flight),
    generation 2 cannot claim the directory; once it is released, generation 2 claims it and
    generation 1's next write is refused."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(CheckpointError, match="stayed locked for 0.3 s"):
            fence(tmp_path, 2, timeout_s=0.3).advance()
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline() == "released\n"
        new = fence(tmp_path, 2)
        assert new.advance() is None  # generation 1 never claimed it: it only wrote
        new.close()
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline() == "superseded\n"
        assert holder.wait(timeout=10) == 0
    finally:
        holder.kill()
        holder.wait(timeout=10)
