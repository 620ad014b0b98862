"""torchrun's command line on `ftrun launch`: every flag of torchrun's own parser is taken, each
value read as torchrun reads it, and docs/torchrun.md lists them all (ftrun/cli/torchrun_*.py)."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest
import torch
from rich.console import Console
from torch.distributed.run import get_args_parser

from ftrun.cli import app as app_module
from ftrun.cli.torchrun_flags import FLAGS, RENDEZVOUS, TorchrunFlags
from ftrun.cli.torchrun_values import (
    Echo,
    EchoingReporter,
    Std,
    nproc_per_node_of,
    parse_nnodes,
    parse_std,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "torchrun.md"


def torchrun_flags() -> list[tuple[str, ...]]:
    """Every option of torchrun's parser, as its spellings (`("--nnodes",)`, `("-r",
    "--redirects")`...)."""
    return [tuple(a.option_strings) for a in get_args_parser()._actions if a.option_strings]


def launch_options() -> set[str]:
    """Every option string `ftrun launch` takes, -h/--help (the group's setting) included."""
    import typer.main

    app_module._register()
    group = typer.main.get_command(app_module.app)
    launch = group.commands["launch"]  # type: ignore[attr-defined]
    parent = group.context_class(group, **group.context_settings)
    context = launch.context_class(launch, parent=parent, **launch.context_settings)
    return {o for p in launch.get_params(context) for o in (*p.opts, *p.secondary_opts)}


def test_launch_takes_every_spelling_of_every_torchrun_flag():
    taken = launch_options()
    missing = [s for flag in torchrun_flags() for s in flag if s not in taken]
    assert not missing, f"torchrun flags `ftrun launch` does not take: {missing}"


def test_the_docs_table_has_a_row_for_every_torchrun_flag():
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| `")]
    first_columns = [set(re.findall(r"`([^` ]+)[^`]*`", row.split(" | ")[0])) for row in rows]
    listed = set().union(*first_columns)
    missing = [flag for flag in torchrun_flags() if not set(flag) <= listed]
    assert not missing, f"docs/torchrun.md has no row for {missing}"


def test_every_flag_ftrun_does_not_map_says_what_it_does_instead():
    mapped = {f.name for f in dataclasses.fields(TorchrunFlags)} - {"others"}
    for name, flag in FLAGS.items():
        assert (flag.instead is None) == (name in mapped), name


@pytest.mark.parametrize(
    "text, bounds, problem",
    [
        ("1", (1, 1), None),
        ("4", (4, 4), None),
        ("1:4", (1, 4), None),
        ("2:2", (2, 2), None),
        ("2:1", None, "--nnodes 2:1: MIN (2) is more than MAX (1)"),
        ("0", None, "--nnodes 0: a job has at least 1 node"),
        ("0:2", None, "at least 1 node"),
        ("a", None, "--nnodes 'a' is not N or MIN:MAX"),
        ("1:2:3", None, "is not N or MIN:MAX"),
        ("1:", None, "is not N or MIN:MAX"),
    ],
)
def test_nnodes_as_torchrun_reads_it(text, bounds, problem):
    problems: list[str] = []
    assert parse_nnodes(text, problems) == bounds
    assert (problems == []) if problem is None else problem in problems[0]


def cpus() -> int:
    return len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    "text, gpus, expected",
    [
        (None, None, None),
        ("2", None, 2),
        ("8", 4, 8),  # a number is a number, whatever the allocation has
        ("cpu", None, "cpus"),
        ("gpu", 4, 4),  # under Slurm: the allocation's GPUs per node
        ("auto", 4, 4),
    ],
)
def test_nproc_per_node_counts_as_torchrun(text, gpus, expected):
    problems: list[str] = []
    got = nproc_per_node_of(text, gpus=gpus, problems=problems)
    assert problems == []
    assert got == (cpus() if expected == "cpus" else expected)


def test_nproc_per_node_auto_is_the_accelerator_else_the_cpus():
    problems: list[str] = []
    expected = torch.accelerator.device_count() if torch.accelerator.is_available() else cpus()
    assert nproc_per_node_of("auto", gpus=None, problems=problems) == expected
    assert problems == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_nproc_per_node_gpu_without_cuda_is_refused_as_torchrun_refuses_it():
    problems: list[str] = []
    assert nproc_per_node_of("gpu", gpus=None, problems=problems) is None
    assert problems == [
        "--nproc-per-node gpu: CUDA is not available on this machine, where ftrun counts the "
        "devices (torchrun stops too: Cuda is not available)"
    ]


def test_nproc_per_node_that_is_no_count_is_refused():
    problems: list[str] = []
    assert nproc_per_node_of("banana", gpus=None, problems=problems) is None
    assert problems == ["--nproc-per-node 'banana' is not a number of ranks, nor gpu/cpu/auto"]


HOSTS = ("a", "b", "c")


@pytest.mark.parametrize(
    "flags, hosts, transport, given, expected, problem",
    [
        (TorchrunFlags(), (), "local", (None, None), (None, None), None),
        (TorchrunFlags(nnodes="1"), ("localhost",), "local", (None, None), (None, None), None),
        (TorchrunFlags(nnodes="1:1"), ("localhost",), "local", (None, None), (None, None), None),
        (
            TorchrunFlags(nnodes="2"),
            ("localhost",),
            "local",
            (None, None),
            (None, None),
            "--nnodes 2: ftrun starts every node of a job itself, from one command on one "
            "machine: name the nodes with --hosts or --hostfile, or use `ftrun sbatch --nodes "
            "2` (not `ftrun launch` on each node)",
        ),
        (TorchrunFlags(nnodes="1:4"), ("localhost",), "local", (None, None), None, "--nodes 4"),
        (TorchrunFlags(nnodes="3"), HOSTS, "ssh", (None, None), (3, 3), None),
        (TorchrunFlags(nnodes="2:4"), HOSTS, "ssh", (None, None), (2, 4), None),
        (TorchrunFlags(nnodes="2:4"), HOSTS, "slurm", (2, None), (2, 4), None),
        (
            TorchrunFlags(nnodes="2"),
            HOSTS,
            "ssh",
            (None, None),
            (None, None),
            "--nnodes 2 asks for 2 nodes but --hosts names 3",
        ),
        (
            TorchrunFlags(nnodes="1"),
            HOSTS,
            "slurm",
            (None, None),
            (None, None),
            "--nnodes 1 asks for 1 node but the Slurm allocation (less --slurm-spares) has 3",
        ),
        (
            TorchrunFlags(nnodes="1:3"),
            HOSTS,
            "ssh",
            (2, None),
            None,
            "--nnodes 1:3 and --min-nodes 2 disagree: give one of them",
        ),
        (TorchrunFlags(node_rank=0), HOSTS, "ssh", (None, None), (None, None), None),
        (
            TorchrunFlags(node_rank=1, nnodes="2"),
            ("localhost",),
            "local",
            (None, None),
            None,
            "--node-rank 1: ftrun launch starts every node of the job itself",
        ),
    ],
)
def test_nnodes_maps_onto_the_hosts(flags, hosts, transport, given, expected, problem):
    problems: list[str] = []
    got = flags.nodes(
        hosts,
        transport=transport,
        named=transport == "ssh",
        min_nodes=given[0],
        max_nodes=given[1],
        problems=problems,
    )
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems
    if expected is not None:
        assert got == expected


@pytest.mark.parametrize(
    "text, std",
    [
        ("0", Std()),
        ("3", Std(every=3)),
        ("0:3,1:0", Std(ranks=((0, 3), (1, 0)))),
    ],
)
def test_std_streams_as_torchrun_reads_them(text, std):
    problems: list[str] = []
    assert parse_std("--redirects", text, problems) == std
    assert problems == []


@pytest.mark.parametrize("text", ["4", "all", "0:4", "0:1,", "a:1", ""])
def test_std_streams_torchrun_refuses_are_refused(text):
    problems: list[str] = []
    parse_std("--tee", text, problems)
    assert len(problems) == 1 and problems[0].startswith(f"--tee {text!r} is not 0-3")


@pytest.mark.parametrize(
    "flags, shown",
    [
        (TorchrunFlags(), None),  # no filter: the plain console
        (TorchrunFlags(tee="3"), None),
        (TorchrunFlags(local_ranks_filter="0"), [True, False, False]),
        (TorchrunFlags(local_ranks_filter="0,2"), [True, False, True]),
        (TorchrunFlags(local_ranks_filter=""), [True, True, True]),  # torchrun: no filter
        (TorchrunFlags(redirects="3"), [False, False, False]),
        (TorchrunFlags(redirects="0:3,2:3"), [False, True, False]),
        # One stream only: ftrun's log holds both, so the rank stays on the console.
        (TorchrunFlags(redirects="1"), [True, True, True]),
        # Teed: on the console, whatever --redirects says.
        (TorchrunFlags(redirects="3", tee="0:1"), [True, False, False]),
        (TorchrunFlags(redirects="3", local_ranks_filter="1"), [False, False, False]),
    ],
)
def test_console_shows_the_local_ranks_torchrun_would(flags, shown):
    problems: list[str] = []
    echo = flags.echo(problems)
    assert problems == []
    if shown is None:
        assert echo is None
    else:
        assert echo is not None and [echo.shows(r) for r in range(3)] == shown


def test_a_bad_filter_is_refused_with_the_rest():
    problems: list[str] = []
    TorchrunFlags(redirects="9", tee="x", local_ranks_filter="0,a").echo(problems)
    assert [p.split(" ")[0] for p in problems] == ["--redirects", "--tee", "--local-ranks-filter"]


def test_the_console_filters_ranks_by_their_local_rank(capsys):
    reporter = EchoingReporter(Console(), Echo(shown=frozenset({0})), nproc_per_node=2)
    for rank in range(4):  # two hosts, two ranks each
        reporter.rank_output(rank, [f"hello from {rank}"])
    assert capsys.readouterr().out == "[rank0]: hello from 0\n[rank2]: hello from 2\n"


def test_flags_ftrun_does_not_need_get_one_line_per_reason():
    flags = TorchrunFlags(
        node_rank=0,
        standalone=True,
        others=("rdzv_backend", "rdzv_endpoint", "rdzv_id", "monitor_interval"),
    )
    notes = flags.notes(remote=False)
    assert notes[0] == f"--rdzv-backend, --rdzv-endpoint, --node-rank: {RENDEZVOUS}"
    assert notes[1].startswith("--rdzv-id: not needed: TORCHELASTIC_RUN_ID is the job's id")
    assert notes[2].startswith("--monitor-interval: not needed")
    assert len(notes) == 3  # --standalone on this machine: nothing to say
    assert any(
        n.startswith("--rdzv-backend, --rdzv-endpoint, --node-rank, --standalone")
        for n in flags.notes(remote=True)
    )
    assert TorchrunFlags().notes(remote=True) == []


def test_run_path_runs_the_script_with_python_as_torchrun_does():
    assert TorchrunFlags(run_path=True).entrypoint(module=True, no_python=True) == (False, False)
    assert TorchrunFlags().entrypoint(module=True, no_python=False) == (True, False)


def test_shutdown_timeout_is_term_timeout():
    problems: list[str] = []
    assert TorchrunFlags(shutdown_timeout=7).term_timeout(None, problems) == 7
    assert TorchrunFlags().term_timeout(3, problems) == 3
    assert problems == []
    TorchrunFlags(shutdown_timeout=7).term_timeout(3, problems)
    assert problems == ["--shutdown-timeout is torchrun's --term-timeout: give one of them"]


def test_log_dir_links_the_job_logs(tmp_path):
    job_dir = tmp_path / "runs" / "job-1"
    flags = TorchrunFlags(log_dir=tmp_path / "torchlogs")
    said = flags.link_logs(job_dir, "job-1")
    link = tmp_path / "torchlogs" / "job-1"
    assert link.is_symlink() and link.resolve() == (job_dir / "logs").resolve()
    assert said == f"rank logs: {link} (the job's {job_dir / 'logs'})"
    assert flags.link_logs(job_dir, "job-1") == said  # a resumed job: the same link, kept
    problems: list[str] = []
    TorchrunFlags(log_dir=link.parent / "job-1" / "..").check_log_dir(problems)
    assert problems == []
    (tmp_path / "a-file").write_text("")
    TorchrunFlags(log_dir=tmp_path / "a-file").check_log_dir(problems)
    assert problems == [f"--log-dir {str(tmp_path / 'a-file')!r} is a file, not a directory"]
