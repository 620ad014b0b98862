"""pytorch/examples' distributed tutorial command lines, `torchrun` replaced by `ftrun launch`
and nothing else changed, on real gloo ranks (tests/bin/ddp_tutorial.py is the tutorial's
multigpu_torchrun.py on CPU: `TOTAL_EPOCHS SAVE_EVERY`)."""

from __future__ import annotations

from tests.conftest import BIN

TUTORIAL = str(BIN / "ddp_tutorial.py")
# Not the command line's business: a warm-started DDP rank now and then does not exit after the
# script's last line (an exit_hang incident; the job succeeds all the same), and 10 s rather than
# the default 60 bound what that costs a run here.
ENV = {"FTRUN_EXIT_TIMEOUT": "10"}


def test_the_single_node_tutorial_line(ftrun, tmp_path):
    # torchrun --standalone --nnodes=1 --nproc_per_node=... multigpu_torchrun.py 5 1
    result = ftrun.run(
        "launch",
        "--standalone",
        "--nnodes=1",
        "--nproc_per_node=2",
        TUTORIAL,
        "5",
        "1",
        cwd=str(tmp_path),
        env=ENV,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in (0, 1):
        assert f"[rank{rank}]: [CPU{rank}] Epoch 4 | Batchsize: 32 | Steps: 1" in result.stdout
    assert "[rank0]: Epoch 4 | Training snapshot saved at snapshot.pt" in result.stdout
    assert (tmp_path / "snapshot.pt").is_file()
    assert "not needed" not in result.stderr  # --standalone on one machine: nothing to say
    job = ftrun.only_job()
    assert (job["state"], job["restarts"]) == ("succeeded", 0)


def test_the_multinode_tutorial_line_on_one_node(ftrun, tmp_path):
    # The multinode tutorial's line for node 0, on one node, with torchrun's console and log
    # flags: only local rank 0 on the console, every rank's output under --log_dir.
    result = ftrun.run(
        "launch",
        "--nproc_per_node=2",
        "--nnodes=1",
        "--node_rank=0",
        "--rdzv_id=456",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=127.0.0.1:29603",
        "--max_restarts=0",
        "--monitor_interval=1",
        "--log_dir=torchlogs",
        "--local_ranks_filter=0",
        TUTORIAL,
        "3",
        "1",
        cwd=str(tmp_path),
        env=ENV,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[rank0]: [CPU0] Epoch 2" in result.stdout
    assert "[rank1]" not in result.stdout
    notes = [line for line in result.stderr.splitlines() if "not needed" in line]
    assert [n.split(":")[1] for n in notes] == [
        " --rdzv-backend, --rdzv-endpoint, --node-rank",
        " --rdzv-id",
        " --monitor-interval",
    ]
    job = ftrun.only_job()
    assert job["state"] == "succeeded"
    rank1 = tmp_path / "torchlogs" / job["job_id"] / "g1" / "rank1.log"
    assert "[CPU1] Epoch 2 | Batchsize: 32 | Steps: 1" in rank1.read_text()
    assert f"rank logs: {tmp_path / 'torchlogs' / job['job_id']}" in result.stderr
    config = ftrun.run_dir / job["job_id"] / "config.json"
    assert '"max_restarts": 0' in config.read_text()
