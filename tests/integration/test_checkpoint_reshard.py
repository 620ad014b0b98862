"""A checkpoint saved under DP=2 x PP=2 (torch.distributed.pipelining) loads under PP=4 and DP=4.

Four gloo ranks on CPU under `ftrun launch`; tests/bin/ckpt_reshard.py compares every parameter,
optimizer tensor and hyper-parameter with the values the saving layout held, bit for bit. And a
host whose ranks are renumbered does not keep the old ranks' memory snapshots.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid

from ftrun.checkpoint import storage
from ftrun.checkpoint.config import memory_tier_dir
from ftrun.claims import Claim, read_claim
from ftrun.controller import jobkey
from tests.conftest import BIN


def test_dp2_pp2_checkpoint_loads_under_pp4_and_dp4(ftrun, tmp_path):
    directory = tmp_path / "ckpt"
    result = ftrun.run(
        "launch",
        "--nproc-per-node",
        "4",
        "--max-restarts",
        "0",
        str(BIN / "ckpt_reshard.py"),
        "--dir",
        str(directory),
        timeout=100,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for layout in ("pp4", "dp4"):
        for rank in range(4):
            assert f"RESHARD OK {layout} rank {rank}" in result.stdout, result.stdout[-3000:]
    [job_dir] = ftrun.run_dir.iterdir()
    key = bytes.fromhex((job_dir / jobkey.KEY_FILE).read_text())  # the job's checkpoint key
    good, bad = storage.list_candidates(directory, key=key)
    assert [c.step for c in good] == [2, 1] and not bad
    manifest = good[0].manifest
    assert manifest["world_size"] == 4
    # Replicated (DP) tensors are written once, spread over the ranks: 4 data files, no copy twice.
    data = [name for name in manifest["files"] if name.endswith(".distcp")]
    assert sorted(data) == [storage.data_file_name(r) for r in range(4)]


def test_a_new_layout_restores_from_the_old_layouts_snapshots_in_host_memory(ftrun, tmp_path):
    """Nothing persisted: the 4 pipeline stages load, bit for bit, from the memory snapshots
    the 2 x 2 layout left on this host (each stage's layers from the rank that held them)."""
    directory = tmp_path / "ckpt"
    result = ftrun.run(
        "launch", "--nproc-per-node", "4", "--max-restarts", "0", str(BIN / "ckpt_reshard.py"),
        "--dir", str(directory), "--memory",
        timeout=100,
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    for rank in range(4):
        assert f"RESHARD OK pp4 rank {rank}" in result.stdout, out[-3000:]
    assert out.count("ftrun-checkpoint: restored step 2 from memory") == 4, out[-3000:]
    assert "saved in another layout (4 ranks, now 4)" in out
    [job_dir] = ftrun.run_dir.iterdir()
    key = bytes.fromhex((job_dir / jobkey.KEY_FILE).read_text())
    good, _ = storage.list_candidates(directory, key=key)
    assert 2 not in [c.step for c in good]  # it came from memory


def test_a_renumbered_hosts_old_rank_directory_is_removed_after_the_first_persist(
    tmp_path, test_id, no_survivors
):
    """Generation 1 runs ranks 0 and 1 on this host; generation 2 runs only rank 0 here (the
    old rank 1 renumbered). Rank 0 restores from both old ranks' memory snapshots, and after its
    first persist removes `rank1/`, which no rank of generation 2 uses: its slots would
    otherwise hold a copy of the whole state in /dev/shm until the job ends. So with the replica
    of rank 1 the peer copy kept here, and not with rank 0's: generation 2 has a rank 0."""
    directory, job = tmp_path / "ckpt", f"test-{uuid.uuid4().hex[:10]}"
    tier = memory_tier_dir(job)
    env = {**os.environ, "FTRUN_TEST_ID": test_id, "TMPDIR": str(tmp_path)}
    script = [str(BIN / "ckpt_stale.py"), "--dir", str(directory), "--job", job]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    try:
        first = subprocess.run(
            [*torchrun, "--nproc-per-node", "2", *script, "--gen", "1"],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        assert sorted(p.name for p in tier.glob("rank*")) == ["rank0", "rank1"]
        for rank in (0, 1):  # replicas in the format of a rank's own tier (docs/peercopy.md)
            shutil.copytree(tier / f"rank{rank}", tier / "replica" / f"rank{rank}")
        second = subprocess.run(
            [sys.executable, *script, "--gen", "2"],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        assert "RESTORED 3 memory" in second.stdout, second.stdout
        assert "STALE RANKS REMOVED 2" in second.stdout, second.stdout
        left = sorted(p.name for p in tier.iterdir())
        assert left == [".generation", "rank0", "replica"]  # nothing set aside is left either
        assert [p.name for p in (tier / "replica").iterdir()] == ["rank0"]
        assert read_claim(tier / "rank0") == Claim(job, 2)
    finally:
        shutil.rmtree(tier, ignore_errors=True)
