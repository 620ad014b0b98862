"""Launch configuration: one frozen, keyword-only dataclass, validated on creation.

Values flow one way: CLI flags → LaunchConfig → components built as Thing(config, ...).
An explicit value beats an FTRUN_* environment variable beats the default, resolved here once.
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftrun import envcontract, filemodes, numbers
from ftrun.errors import UsageError
from ftrun.timeouts import ControlTimeouts

DEFAULT_RUN_DIR = Path("~/.ftrun/runs")
# What --forward-signal cannot pass on: INT and TERM stop the job, KILL and STOP cannot be
# caught, CHLD is the launcher's own business.
UNFORWARDABLE_SIGNALS = frozenset({"SIGINT", "SIGTERM", "SIGKILL", "SIGSTOP", "SIGCHLD"})


def resolve_run_dir(
    explicit: str | os.PathLike[str] | None, environ: Mapping[str, str] = os.environ
) -> Path:
    """--run-dir beats FTRUN_RUN_DIR beats ~/.ftrun/runs (the same rule for every command)."""
    chosen = explicit if explicit else environ.get(envcontract.RUN_DIR) or DEFAULT_RUN_DIR
    return Path(chosen).expanduser().resolve()


def standby_run_dir(run_dir: Path, host: str) -> Path:
    """Where the standby on `host` keeps its replica of a job directory: a run directory of
    its own, on that host (docs/standby.md)."""
    return run_dir / ".standby" / host


def signal_name(text: str) -> str:
    """USR1, usr1, SIGUSR1 → SIGUSR1 (validated by LaunchConfig)."""
    name = text.strip().upper()
    return name if name.startswith("SIG") else f"SIG{name}"


def new_job_id(name: str, *, suffix: str | None = None) -> str:
    """`name-1a2b3c`; with `suffix` (a Slurm job's id) `name-slurm1234`, the same every time the
    job is requeued, so the requeued job finds its directory."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.")[:40] or "job"
    return f"{slug}-{suffix or secrets.token_hex(3)}"


# A float field's flag, where it is not `--` + the field's name less its unit.
STRAGGLER_POLICIES = ("report", "replace", "drop")
FLAG_OF = {"peer_copy_mbps": "--peer-copy-rate", "preempt_grace_s": "--preempt-grace"}


def flag_of(field_name: str) -> str:
    if field_name in FLAG_OF:
        return FLAG_OF[field_name]
    return "--" + field_name.removesuffix("_s").replace("_", "-")


def not_numbers(config: Any) -> list[str]:
    """One problem per float field of a dataclass that is NaN or infinite: `--hang-floor nan`
    turned hang detection off, `--term-timeout inf` waited for ever (issue 34)."""
    return [
        problem
        for f in dataclasses.fields(config)
        if isinstance(value := getattr(config, f.name), float)
        and (problem := numbers.problem(flag_of(f.name), value))
    ]


@dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    """Everything one `ftrun launch` needs; written to <job dir>/config.json.

    All but the fault policy: that is the controller's own type (controller/policy_file.py),
    so the Supervisor takes it beside this config rather than config.py importing upward."""

    job_id: str
    job_name: str
    run_dir: Path
    script: str
    script_args: tuple[str, ...] = ()
    module: bool = False
    no_python: bool = False
    nproc_per_node: int = 1
    max_restarts: int = 3
    master_port: int | None = None
    progress_regex: str | None = None
    # Start ranks by forking a pre-imported interpreter (see ftrun/agent/zygote.py).
    warm_start: bool = True
    cwd: str = field(default_factory=os.getcwd)
    python: str = sys.executable
    # SIGTERM → SIGKILL for ranks when the job is stopped or reconfigured (--term-timeout).
    term_timeout_s: float = 5.0
    # Signals the launcher passes on to every rank (SIGUSR1, ...), for the script's handlers.
    forward_signals: tuple[str, ...] = ()
    # The user's variables for every rank on every host (ftrun/userenv.py): values may be
    # secrets, so they stay out of repr() and config.json.
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    # The launcher's environment every agent gets (envcontract.forwarded: NCCL_*, PYTHONPATH,
    # ...), read once by the CLI: over ssh nothing is inherited. Kept out of config.json too.
    forward_env: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    # Modules the warm interpreter imports ahead of the first rank ($FTRUN_ZYGOTE_PRELOAD);
    # empty: the zygote's own default list.
    zygote_preload: str = ""
    # After a rank exits 0, how long the others have to exit (controller/stall.py).
    exit_timeout_s: float = 60.0
    # Zero-config hang guard: every rank without CPU or output this long is a hang; 0: off.
    idle_timeout_s: float = 1800.0
    # The control plane's timing (ftrun/timeouts.py, docs/timeouts.md).
    heartbeat_interval_s: float = ControlTimeouts.heartbeat_interval_s
    host_lost_timeout_s: float = ControlTimeouts.host_lost_timeout_s
    fence_timeout_s: float = ControlTimeouts.fence_timeout_s
    local_stall_timeout_s: float = ControlTimeouts.local_stall_timeout_s
    agent_start_timeout_s: float = 30.0
    # How long agents keep their ranks once the controller is gone, waiting for `ftrun resume`
    # to adopt them (agent/link.py); 0: they fence at once. Not under Slurm (srun dies too).
    controller_grace_s: float = 60.0
    # The peer tier (ftrun/peercopy): MB/s each host streams its ranks' newest memory snapshots
    # to the next host at, at most; 0: no peer copies.
    peer_copy_mbps: float = 1000.0
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 30.0
    # Hosts as the user wrote them (ftrun/hostlist.py). No --hosts: this machine, no ssh.
    hosts: tuple[str, ...] = ("localhost",)
    spares: tuple[str, ...] = ()
    # The host that keeps a standby controller (docs/standby.md); None: none.
    standby: str | None = None
    # Fewest hosts the job may shrink to after losing some (torchrun's --nnodes MIN:MAX).
    min_nodes: int = 1
    # Most hosts the job grows to as hosts are added (torchrun's MAX); None: as many as --hosts.
    # A spot job names the hosts it starts on and lets `ftrun hosts add` bring it up to this.
    max_nodes: int | None = None
    # Prometheus metrics from the launcher (cli/metrics.py): None: not served; 0: a free port.
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"
    # How agents start: "local" (this machine), "ssh" (--hosts), "slurm" (srun, --slurm); the
    # transports by name, and what each can do: ftrun/transport/registry.py.
    transport: str = "local"
    # That transport's own options: the dataclass its Backend names (transport/options.py:
    # ssh's config file and host-key checks, the Slurm allocation's id and GPUs); None: its
    # defaults. Typed loosely here: the ground floor does not know the transports.
    transport_options: Any = None
    # The interpreter agents run on remote hosts [default: the controller's own path].
    remote_python: str | None = None
    # The address agents dial [default: the address this machine uses to reach each host].
    controller_addr: str | None = None
    # What a preemption notice (Slurm's batch step --signal, docs/slurm.md) does: which signal
    # it is, how long the ranks get to commit a checkpoint, and whether the job is then
    # requeued.
    preempt_signal: str = "SIGUSR2"
    preempt_grace_s: float = 60.0
    requeue: bool = False
    # A planned job (docs/planner.md): the model profile (JSON, copied into the job directory),
    # the global batch every plan keeps [the profile's], the memory of one slot's device [the
    # profile's; none: unbounded], and how far ahead a grow must pay for its restart.
    profile: str | None = None
    global_batch: int | None = None
    device_memory_bytes: int | None = None
    replan_horizon_s: float = 1800.0
    # A host named a straggler (controller/pace.py): report it, replace it with a ready spare,
    # or drop it and re-plan, when that pays over replan_horizon_s (controller/job.py).
    stragglers: str = "report"
    # Who may read what the job writes (run and job directories, logs, checkpoints): only the
    # user (umask 077), or with --group-readable the user's group too (027): ftrun/filemodes.py.
    group_readable: bool = False
    # TLS 1.3 between hosts (ftrun/tls.py); False only with --insecure-plain-control.
    control_tls: bool = True
    # A pairwise gloo probe of the hosts' links before the first generation, and of each host
    # before it joins; a host slow with every peer is left out (controller/link_check.py).
    link_check: bool = False

    def __post_init__(self) -> None:
        problems = not_numbers(self)  # NaN passes every bound below, inf most of them
        if self.stragglers not in STRAGGLER_POLICIES:
            problems.append(
                f"--stragglers must be one of {', '.join(STRAGGLER_POLICIES)} "
                f"(got {self.stragglers!r})"
            )
        if self.nproc_per_node < 1:
            problems.append(f"--nproc-per-node must be at least 1 (got {self.nproc_per_node})")
        if self.max_restarts < 0:
            problems.append(f"--max-restarts must be 0 or more (got {self.max_restarts})")
        if self.master_port is not None and not 0 < self.master_port < 65536:
            problems.append(f"--master-port must be in 1..65535 (got {self.master_port})")
        if self.term_timeout_s < 0:
            problems.append(f"--term-timeout must be 0 or more (got {self.term_timeout_s:g})")
        for name in self.forward_signals:
            if name not in signal.Signals.__members__:
                problems.append(f"--forward-signal: no signal {name!r}")
            elif name in UNFORWARDABLE_SIGNALS:
                problems.append(
                    f"--forward-signal cannot take {name}: "
                    + (
                        "it stops the job (see --term-timeout)"
                        if name in ("SIGINT", "SIGTERM")
                        else "it cannot be passed on"
                    )
                )
        problems.extend(self.timeouts.problems())
        if self.controller_grace_s < 0:
            problems.append(
                f"--controller-grace must be 0 (off) or more (got {self.controller_grace_s:g})"
            )
        if self.peer_copy_mbps < 0:
            problems.append(
                f"--peer-copy-rate must be 0 (off) or more (got {self.peer_copy_mbps:g})"
            )
        if not self.exit_timeout_s > 0:
            problems.append(f"--exit-timeout must be more than 0 (got {self.exit_timeout_s:g})")
        if self.idle_timeout_s < 0:
            problems.append(f"--idle-timeout must be 0 (off) or more (got {self.idle_timeout_s:g})")
        if not 1 <= self.min_nodes <= len(self.hosts):
            problems.append(
                f"--min-nodes must be in 1..{len(self.hosts)} (the number of hosts); "
                f"got {self.min_nodes}"
            )
        if self.max_nodes is not None and self.max_nodes < max(self.min_nodes, 1):
            problems.append(
                f"--max-nodes must be at least --min-nodes ({self.min_nodes}); got {self.max_nodes}"
            )
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            problems.append(f"--metrics-port must be 0 to 65535 (got {self.metrics_port})")
        if self.spares and not self.remote:
            problems.append("--spares needs --hosts or --hostfile (spares are other machines)")
        if self.standby is not None and self.standby not in (*self.hosts, *self.spares):
            problems.append(f"--standby {self.standby} is not one of the job's --hosts or --spares")
        elif self.standby is not None and not self.remote:
            problems.append("--standby needs hosts on other machines (--hosts or --hostfile)")
        if self.preempt_signal not in signal.Signals.__members__:
            problems.append(f"--preempt-signal: no signal {self.preempt_signal!r}")
        elif self.preempt_signal in UNFORWARDABLE_SIGNALS:
            problems.append(
                f"--preempt-signal cannot be {self.preempt_signal}: INT and TERM stop the job"
            )
        if not self.preempt_grace_s > 0:
            problems.append(f"--preempt-grace must be more than 0 (got {self.preempt_grace_s:g})")
        if self.profile is None and (
            self.global_batch is not None or self.device_memory_bytes is not None
        ):
            problems.append("--global-batch and --device-memory plan a job: they need --profile")
        if self.global_batch is not None and self.global_batch < 1:
            problems.append(f"--global-batch must be at least 1 (got {self.global_batch})")
        if self.device_memory_bytes is not None and self.device_memory_bytes < 1:
            problems.append("--device-memory must be more than 0")
        if not self.replan_horizon_s > 0:
            problems.append(f"--replan-horizon must be more than 0 (got {self.replan_horizon_s:g})")
        if self.progress_regex is not None:
            try:
                compiled = re.compile(self.progress_regex)
            except re.error as e:
                problems.append(f"--progress-regex is not a valid regular expression: {e}")
            else:
                if compiled.groups < 1:
                    problems.append(
                        "--progress-regex needs one group that captures the step number"
                    )
        if problems:
            raise UsageError("; ".join(problems), hint="see `ftrun launch --help`")

    @property
    def timeouts(self) -> ControlTimeouts:
        return ControlTimeouts(
            heartbeat_interval_s=self.heartbeat_interval_s,
            host_lost_timeout_s=self.host_lost_timeout_s,
            fence_timeout_s=self.fence_timeout_s,
            local_stall_timeout_s=self.local_stall_timeout_s,
        )

    @property
    def planned(self) -> bool:
        """The controller plans DP x PP for the hosts at hand (docs/planner.md)."""
        return self.profile is not None

    @property
    def remote(self) -> bool:
        """Agents run on other machines (ssh hosts or Slurm nodes): hosts can be lost,
        retried, replaced and added."""
        return self.transport != "local"

    @property
    def umask(self) -> int:
        """The umask the controller and every agent run with (before any rank starts)."""
        return filemodes.umask_for(self.group_readable)

    @property
    def job_dir(self) -> Path:
        return self.run_dir / self.job_id

    @property
    def agent_python(self) -> str:
        """The interpreter agents run: --remote-python on remote hosts, else ours."""
        return (self.remote_python or self.python) if self.remote else self.python

    def entrypoint(self) -> list[str]:
        """What each rank runs, in torchrun's terms (python is prepended unless --no-python)."""
        if self.no_python:
            return [self.script, *self.script_args]
        if self.module:
            return [self.agent_python, "-u", "-m", self.script, *self.script_args]
        return [self.agent_python, "-u", self.script, *self.script_args]

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["run_dir"] = str(self.run_dir)
        out["script_args"] = list(self.script_args)
        out["hosts"] = list(self.hosts)
        out["spares"] = list(self.spares)
        out["forward_signals"] = list(self.forward_signals)
        out["env"] = [name for name, _ in self.env]  # names only: values may be secrets
        out["forward_env"] = [name for name, _ in self.forward_env]
        return out
