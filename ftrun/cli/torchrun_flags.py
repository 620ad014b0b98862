"""torchrun's command line on `ftrun launch`, word for word.

A tutorial's or a cluster script's `torchrun --standalone --nnodes=1 --nproc_per_node=gpu
train.py` runs with `ftrun launch` in torchrun's place. Every flag torchrun's parser takes
(torch/distributed/run.py, both spellings) is one of three things on `ftrun launch`:

- ftrun's own flag of that name (--nproc-per-node, --max-restarts, -m, --no-python, --master-port);
- mapped here onto ftrun's settings: --nnodes onto the hosts and --min-nodes/--max-nodes,
  --nproc-per-node gpu|cpu|auto onto a number, --run-path, --shutdown-timeout onto --term-timeout,
  --log-dir, and --redirects/--tee/--local-ranks-filter onto which ranks the console shows;
- accepted with one line that says what ftrun does instead (FLAGS' `instead`): ftrun starts every
  host itself and picks the rendezvous for each generation, so the rendezvous flags mean nothing
  to it.

FLAGS, the table of them all, is torchrun_table.py's; this module maps the flags given.

`accept_torchrun_flags` adds these flags to a command's parameters and hands them to it as one
`TorchrunFlags`, so `launch.py` wires them without growing a parameter per flag. docs/torchrun.md
is the table for people; tests/unit/test_torchrun_flags.py checks it and FLAGS against torchrun's
own parser.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from ftrun.cli import launch_options as opts
from ftrun.cli.render import ConsoleReporter
from ftrun.cli.torchrun_table import FLAGS, HELP, RENDEZVOUS, Flag
from ftrun.cli.torchrun_values import Echo, parse_nnodes, parse_std
from ftrun.config import LaunchConfig
from ftrun.errors import UsageError
from ftrun.transport.registry import backend


@dataclasses.dataclass(frozen=True, kw_only=True)
class TorchrunFlags:
    """torchrun's flags as given on the command line; the ones ftrun does not need are named
    in `others` (parameter names, for the one-line notices)."""

    nnodes: str | None = None
    standalone: bool = False
    node_rank: int | None = None
    run_path: bool = False
    log_dir: Path | None = None
    redirects: str | None = None
    tee: str | None = None
    local_ranks_filter: str | None = None
    shutdown_timeout: float | None = None
    others: tuple[str, ...] = ()

    def entrypoint(self, *, module: bool, no_python: bool) -> tuple[bool, bool]:
        """(module, no_python): torchrun's --run-path runs the script with runpy.run_path in a
        Python interpreter, before -m and --no-python; ftrun's ranks run it with python."""
        return (False, False) if self.run_path else (module, no_python)

    def nodes(
        self,
        hosts: tuple[str, ...],
        *,
        transport: str,
        named: bool,
        min_nodes: int | None,
        max_nodes: int | None,
        problems: list[str],
    ) -> tuple[int | None, int | None]:
        """--nnodes onto (--min-nodes, --max-nodes). ftrun starts every host of a job from this
        one command, so the hosts must be there to count: --hosts, --hostfile or a Slurm
        allocation. `named`: --hosts or --hostfile was given (a problem with them is reported
        already)."""
        if self.node_rank:
            problems.append(
                f"--node-rank {self.node_rank}: ftrun launch starts every node of the job "
                "itself and numbers them: run it once, on one machine, for all of them"
            )
        if self.nnodes is None:
            return min_nodes, max_nodes
        bounds = parse_nnodes(self.nnodes, problems)
        if bounds is None:
            return min_nodes, max_nodes
        low, high = bounds
        hosts_given_by = backend(transport).hosts_given_by
        if not backend(transport).remote:
            if (low, high) != (1, 1) and not named:
                problems.append(
                    f"--nnodes {self.nnodes}: ftrun starts every node of a job itself, from one "
                    "command on one machine: name the nodes with --hosts or --hostfile, or use "
                    f"`ftrun sbatch --nodes {high}` (not `ftrun launch` on each node)"
                )
            return min_nodes, max_nodes
        if not low <= len(hosts) <= high:
            span = str(low) if low == high else f"{low} to {high}"
            problems.append(
                f"--nnodes {self.nnodes} asks for {span} node{'s' if high > 1 else ''} but "
                f"{hosts_given_by} {len(hosts)}"
            )
            return min_nodes, max_nodes
        for flag, given_value, mapped in (
            ("--min-nodes", min_nodes, low),
            ("--max-nodes", max_nodes, high),
        ):
            if given_value is not None and given_value != mapped:
                problems.append(
                    f"--nnodes {self.nnodes} and {flag} {given_value} disagree: give one of them"
                )
        return low, high

    def term_timeout(self, term_timeout: float | None, problems: list[str]) -> float | None:
        """--shutdown-timeout is torchrun's --term-timeout (SIGTERM, then SIGKILL after it)."""
        if self.shutdown_timeout is None:
            return term_timeout
        if term_timeout is not None and term_timeout != self.shutdown_timeout:
            problems.append("--shutdown-timeout is torchrun's --term-timeout: give one of them")
        return self.shutdown_timeout

    def echo(self, problems: list[str]) -> Echo | None:
        """Which local ranks the console shows; None: all of them."""
        redirects = parse_std("--redirects", self.redirects or "0", problems)
        tee = parse_std("--tee", self.tee or "0", problems)
        if self.redirects is None and self.local_ranks_filter is None:
            return None
        shown = None
        if self.local_ranks_filter:  # torchrun: an empty filter is no filter
            try:
                shown = frozenset(int(r) for r in self.local_ranks_filter.split(","))
            except ValueError:
                problems.append(
                    f"--local-ranks-filter {self.local_ranks_filter!r} is not a "
                    "comma-separated list of local ranks, e.g. 0,1,2"
                )
        return Echo(shown=shown, redirects=redirects, tee=tee)

    def check_log_dir(self, problems: list[str]) -> None:
        if self.log_dir is not None and self.log_dir.exists() and not self.log_dir.is_dir():
            problems.append(f"--log-dir {str(self.log_dir)!r} is a file, not a directory")

    def link_logs(self, job_dir: Path, job_id: str) -> str | None:
        """--log-dir DIR: DIR/<job id> is a link to the job's rank logs (torchrun makes a
        directory per run there). The line that says so, or None without --log-dir."""
        if self.log_dir is None:
            return None
        link = self.log_dir.expanduser().absolute() / job_id
        target = job_dir / "logs"
        try:
            link.parent.mkdir(parents=True, exist_ok=True)
            if not (link.is_symlink() and Path(os.readlink(link)) == target):
                link.symlink_to(target, target_is_directory=True)
        except OSError as e:
            raise UsageError(
                f"--log-dir: cannot link {link} to the rank logs: {e.strerror or e}",
                hint="give --log-dir a directory you can write, or leave it out: the rank logs "
                f"are in {target}",
            ) from None
        return f"rank logs: {link} (the job's {target})"

    def announce(self, reporter: ConsoleReporter, config: LaunchConfig) -> None:
        """Link --log-dir, then say what ftrun does with the torchrun flags given, one line
        for each reason."""
        link = self.link_logs(config.job_dir, config.job_id)
        for line in [*self.notes(remote=config.remote), *([link] if link else [])]:
            reporter.notice(line)

    def notes(self, *, remote: bool) -> list[str]:
        """One line per reason for the flags given that ftrun does not need or maps its own
        way: `--rdzv-backend, --rdzv-endpoint: not needed: ...`."""
        by_reason: dict[str, list[str]] = {}
        for name in self.others:
            flag = FLAGS[name]
            by_reason.setdefault(flag.instead or "", []).append(flag.flag)
        if self.node_rank == 0:
            by_reason.setdefault(RENDEZVOUS, []).append("--node-rank")
        if self.standalone and remote:
            by_reason.setdefault(RENDEZVOUS, []).append("--standalone")
        if self.tee is not None:
            by_reason.setdefault(
                "ftrun shows every rank's output on the console and keeps it in its log "
                "already (--redirects 3 or --local-ranks-filter take ranks off the console)",
                [],
            ).append("--tee")
        if self.redirects is not None and parse_std("", self.redirects, []).values() & {1, 2}:
            by_reason.setdefault(
                "ftrun keeps a rank's stdout and stderr in one log, so only 3 (both) takes a "
                "rank off the console",
                [],
            ).append("--redirects 1 or 2")
        return [f"{', '.join(flags)}: {reason}" for reason, flags in by_reason.items()]


def accept_torchrun_flags(command: Callable[..., None]) -> Callable[..., None]:
    """`command` with torchrun's FLAGS (and --version) added to its parameters; it gets them as
    one TorchrunFlags, its `torchrun` parameter."""
    own = inspect.signature(command, eval_str=True)
    params = [p for p in own.parameters.values() if p.name != "torchrun"]
    added = [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=_option(name, flag),
            annotation=bool if flag.kind is bool else flag.kind | None,
        )
        for name, flag in FLAGS.items()
    ]
    added.append(
        inspect.Parameter(
            "version", inspect.Parameter.KEYWORD_ONLY, default=opts.VERSION, annotation=bool
        )
    )

    @functools.wraps(command)
    def with_torchrun_flags(**values: Any) -> None:
        values.pop("version", None)
        # Given: not the default (None, or False for a switch); 0 is a value (--node-rank 0).
        given = {n: v for n in FLAGS if (v := values.pop(n)) is not None and v is not False}
        mapped = {f.name for f in dataclasses.fields(TorchrunFlags)} - {"others"}
        flags = TorchrunFlags(
            **{n: v for n, v in given.items() if n in mapped},
            others=tuple(n for n in given if n not in mapped),
        )
        command(**values, torchrun=flags)

    signature = own.replace(parameters=[*params, *added])
    with_torchrun_flags.__signature__ = signature  # type: ignore[attr-defined]
    with_torchrun_flags.__annotations__ = {
        p.name: p.annotation for p in signature.parameters.values()
    }
    return with_torchrun_flags


def _option(name: str, flag: Flag) -> Any:
    text = HELP.get(name) or "torchrun's: accepted, ftrun does not need it (docs/torchrun.md)."
    if flag.kind is bool:
        return typer.Option(False, *flag.names, help=text)
    return typer.Option(None, *flag.names, metavar=flag.metavar, min=flag.minimum, help=text)
