"""`ftrun launch` with torchrun's values that torchrun itself would refuse, or that mean
something else to ftrun: one message with a hint, exit 2, no traceback, and no job started.
And -h/--version, on `ftrun` and on `ftrun launch`."""

from __future__ import annotations

from importlib import metadata

import pytest
import torch

from tests.conftest import BIN, Ftrun

SCRIPT = str(BIN / "ddp_tutorial.py")


def refused(ftrun: Ftrun, *flags: str) -> str:
    result = ftrun.run("launch", *flags, SCRIPT, "5", "1", timeout=60)
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert "Traceback" not in out
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: ")
    assert not ftrun.run_dir.exists() or not any(ftrun.run_dir.iterdir())  # no job
    return result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_nproc_per_node_gpu_without_cuda(ftrun: Ftrun) -> None:
    err = refused(ftrun, "--standalone", "--nnodes=1", "--nproc_per_node=gpu")
    assert "error: --nproc-per-node gpu: CUDA is not available on this machine" in err
    assert "hint: --nproc-per-node takes a number of ranks per host, or as torchrun: gpu" in err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--nproc-per-node", "banana"], "--nproc-per-node 'banana' is not a number of ranks"),
        (["--nnodes", "2:1"], "--nnodes 2:1: MIN (2) is more than MAX (1)"),
        (["--nnodes=2", "--nproc_per_node=2"], "--nnodes 2: ftrun starts every node of a job"),
        (["--nnodes", "1:4"], "or use `ftrun sbatch --nodes 4`"),
        (["--nnodes=2", "--node_rank=1"], "--node-rank 1: ftrun launch starts every node"),
        (["-r", "5"], "--redirects '5' is not 0-3"),
        (["--local_ranks_filter", "0;1"], "--local-ranks-filter '0;1' is not a comma-sep"),
        (["--shutdown-timeout", "3", "--term-timeout", "4"], "--shutdown-timeout is torchrun's"),
    ],
)
def test_values_torchrun_refuses_or_ftrun_cannot_honour(ftrun: Ftrun, flags, message) -> None:
    assert message in refused(ftrun, *flags)


def test_every_problem_in_one_message(ftrun: Ftrun) -> None:
    err = refused(ftrun, "--nnodes", "0", "--nproc-per-node", "x", "--tee", "7")
    assert "--nnodes 0" in err and "--nproc-per-node 'x'" in err and "--tee '7'" in err


@pytest.mark.parametrize("command", [[], ["launch"]])
def test_version_and_short_help(ftrun: Ftrun, command: list[str]) -> None:
    result = ftrun.run(*command, "--version", timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"ftrun {metadata.version('ftrun')}\n"
    result = ftrun.run(*command, "-h", timeout=60)
    assert result.returncode == 0, result.stderr
    assert "Usage:" in result.stdout and "-h, --help" in result.stdout
    if command:
        assert "--nproc-per-node, --nproc_per_node" in result.stdout
        assert "--nnodes N|MIN:MAX" in result.stdout
