"""The `ftrun launch` options that `ftrun sbatch` passes on to the `ftrun launch --slurm` step.

Each is defined once here, as the typer Option (flag names, default, envvar, help) a command's
signature takes as its default value (`nproc_per_node: int = options.NPROC_PER_NODE`), and
`PASSED_ON` names them by parameter. `argv()` turns the values a command received back into the
flags that give `ftrun launch` the same values, so the batch script's step and a `ftrun launch`
typed by hand read the same options the same way.

Left out, because Slurm or the batch script decides them: where the hosts are (--hosts,
--hostfile, --spares, --ssh-config, --remote-python, --controller-addr, --min-nodes), the
rendezvous port; --job-name and --run-dir are shared but not passed on as given: the script
passes the name and the resolved directory chosen at submission. Below them, options that only
`ftrun launch` has (--version: `ftrun` has it too); torchrun's flags are in torchrun_flags.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata
from typing import Any

import typer
from typer.models import OptionInfo

from ftrun import envcontract

NPROC_PER_NODE: Any = typer.Option(
    None,
    "--nproc-per-node",
    "--nproc_per_node",
    help="Ranks per host [1; under Slurm, its GPUs per node if set]. `ftrun launch` also takes "
    "torchrun's gpu (one per CUDA device), cpu (one per CPU) and auto (per accelerator device, "
    "else per CPU), counted on the launching machine.",
)
MAX_RESTARTS: Any = typer.Option(
    3, "--max-restarts", "--max_restarts", help="Job-wide restart budget."
)
MODULE: Any = typer.Option(False, "-m", "--module", help="Run SCRIPT as a Python module.")
NO_PYTHON: Any = typer.Option(
    False, "--no-python", "--no_python", help="Run SCRIPT as an executable, not with python."
)
PROGRESS_REGEX: Any = typer.Option(
    None, "--progress-regex", help="Derive step progress from output, e.g. 'step (\\d+)'."
)
TERM_TIMEOUT: Any = typer.Option(
    None,
    "--term-timeout",
    help="Seconds ranks get between SIGTERM and SIGKILL when the job is stopped [5].",
)
FORWARD_SIGNAL: Any = typer.Option(
    None,
    "--forward-signal",
    metavar="SIGS",
    help="Signals passed on to every rank, e.g. USR1,USR2 (preemption notices).",
)
ENV: Any = typer.Option(
    None,
    "--env",
    metavar="NAME[=VALUE]",
    help="A variable for the ranks on every host: NAME=VALUE, or NAME to pass on its value "
    "here. Repeatable.",
)
ENV_FILE: Any = typer.Option(
    None,
    "--env-file",
    metavar="FILE",
    help="NAME=VALUE lines (# comments) for the ranks on every host; --env wins. Repeatable.",
)
EXIT_TIMEOUT: Any = typer.Option(
    60.0,
    "--exit-timeout",
    envvar=envcontract.EXIT_TIMEOUT,
    help="Once a rank exits 0, seconds the others have to exit before their stacks are "
    "taken and they are killed.",
)
IDLE_TIMEOUT: Any = typer.Option(
    1800.0,
    "--idle-timeout",
    envvar=envcontract.IDLE_TIMEOUT,
    help="Without a progress signal: seconds every rank may go without CPU or output "
    "before it counts as a hang (0: off).",
)
WARM_START: Any = typer.Option(
    True, "--warm-start/--cold-start", help="Fork ranks from a pre-imported interpreter."
)
POLICY: Any = typer.Option(None, "--policy", help="A TOML fault policy (rules, quarantine, hang).")
STARTUP_TIMEOUT: Any = typer.Option(
    None, "--startup-timeout", help="Seconds a rank may take to its first step [300]."
)
HANG_FLOOR: Any = typer.Option(
    None,
    "--hang-floor",
    help="A rank is suspected of a hang after max(floor, factor x step time) [2]; the verdict"
    " needs evidence (docs/policy.md).",
)
HANG_FACTOR: Any = typer.Option(None, "--hang-factor", help="See --hang-floor [5].")
HEARTBEAT_INTERVAL: Any = typer.Option(
    None, "--heartbeat-interval", help="Seconds between heartbeats, both ways [0.25]."
)
HOST_LOST_TIMEOUT: Any = typer.Option(
    None,
    "--host-lost-timeout",
    help="Seconds of silence before a host is lost [1.0]; see docs/timeouts.md.",
)
FENCE_TIMEOUT: Any = typer.Option(
    None,
    "--fence-timeout",
    help="Seconds of silence from the controller before an agent takes it for gone [3.0].",
)
CONTROLLER_GRACE: Any = typer.Option(
    60.0,
    "--controller-grace",
    help="Seconds agents keep their ranks once the controller is gone, for `ftrun resume` to "
    "adopt them; 0 = kill them at once (always under Slurm).",
)
STANDBY: Any = typer.Option(
    None,
    "--standby",
    help="A host (one of --hosts or --spares) that keeps a standby controller: if this machine "
    "is lost, it takes the job over and adopts the running ranks (docs/standby.md) "
    "[over ssh: the first spare, else the second host].",
)
NO_STANDBY: Any = typer.Option(
    False,
    "--no-standby",
    help="No standby controller: if this machine is lost, the job waits --controller-grace "
    "for `ftrun resume`.",
)
PEER_COPY_RATE: Any = typer.Option(
    1000.0,
    "--peer-copy-rate",
    help="MB/s at most that each host streams its ranks' newest memory snapshots to the next "
    "host at, so a spare that replaces a lost host restores from memory; 0 = no peer copies.",
)
LOCAL_STALL_TIMEOUT: Any = typer.Option(
    None,
    "--local-stall-timeout",
    help="Seconds an agent may be silent but known to be there (its process alive, or its "
    "machine still acknowledging) before it is lost anyway; 0 = never [60].",
)
PROFILE: Any = typer.Option(
    None,
    "--profile",
    metavar="FILE",
    help="A model profile (`ftrun profile`): plan DP x PP for the hosts at hand, and again "
    "whenever they change; see docs/planner.md.",
)
GLOBAL_BATCH: Any = typer.Option(
    None,
    "--global-batch",
    help="With --profile: samples per step every plan keeps [the profile's].",
)
DEVICE_MEMORY: Any = typer.Option(
    None,
    "--device-memory",
    metavar="SIZE",
    help="With --profile: memory of one rank's device, e.g. 80GiB [the profile's].",
)
REPLAN_HORIZON: Any = typer.Option(
    1800.0,
    "--replan-horizon",
    help="With --profile: seconds of training ahead a grow must pay its restart back in.",
)
STRAGGLERS: Any = typer.Option(
    "report",
    "--stragglers",
    help="A host named a straggler (docs/policy.md): report it, replace it with a ready spare, "
    "or drop it and re-plan; either only when the time it saves over --replan-horizon exceeds "
    "the measured cost of the restart. [report]",
)
GROUP_READABLE: Any = typer.Option(
    False,
    "--group-readable",
    help="Let the user's group read the job's directories, logs and checkpoints (0750/0640) "
    "[only the user: 0700/0600].",
)
INSECURE_PLAIN_CONTROL: Any = typer.Option(
    False,
    "--insecure-plain-control",
    help="Do not encrypt the control plane between hosts (INSECURE: the network sees the "
    "ranks' output; messages stay authenticated) [TLS 1.3 between hosts]. For thousands of "
    "hosts on a trusted network: TLS costs the controller ~1.2-1.4x CPU (docs/security.md).",
)

# `ftrun launch`'s alone for now (`ftrun sbatch` does not take it yet).
LINK_CHECK: Any = typer.Option(
    False,
    "--link-check",
    help="Before the first step, pair the hosts up in two rounds of a short gloo probe "
    "(latency, bandwidth) and leave out a host slow with each of its peers; later, probe each "
    "host before it joins (docs/policy.md) [off]. Multi-host jobs only.",
)

# Shared by both commands but not passed on: the batch script gives the ones chosen at submission.
JOB_NAME: Any = typer.Option(None, "--job-name", help="Name shown by status.")
RUN_DIR: Any = typer.Option(
    None,
    "--run-dir",
    envvar=envcontract.RUN_DIR,
    help="Where job directories go [default: ~/.ftrun/runs].",
)

# `ftrun launch`'s alone: the batch script's step sets them, or they mean nothing under sbatch.
MASTER_PORT: Any = typer.Option(
    None,
    "--master-port",
    "--master_port",
    help="Rendezvous port [default: a free one per generation].",
)
GRACE_PERIOD: Any = typer.Option(
    None, "--grace-period", hidden=True, help="The old name of --term-timeout."
)
SLURM: Any = typer.Option(
    None,
    "--slurm/--no-slurm",
    help="Run on the nodes of this Slurm allocation, agents started with srun [on inside "
    "an allocation when no --hosts are given].",
)
SLURM_SPARES: Any = typer.Option(
    0,
    "--slurm-spares",
    min=0,
    metavar="K",
    help="Under --slurm: the last K nodes wait as spares.",
)
JOB_ID: Any = typer.Option(
    None,
    "--job-id",
    help="The job's id (its directory's name) [a new one]; a job directory of a "
    "preempted job is resumed (what a requeued `ftrun sbatch` job does). One job at a time "
    "per id on a machine.",
)
PREEMPT_SIGNAL: Any = typer.Option(
    "USR2",
    "--preempt-signal",
    metavar="SIG",
    help="The signal that says the job will be stopped soon (Slurm's --signal): ranks "
    "commit a checkpoint, then the job stops.",
)
PREEMPT_GRACE: Any = typer.Option(
    60.0,
    "--preempt-grace",
    help="Seconds the ranks get after a preemption notice to commit a checkpoint.",
)
REQUEUE: Any = typer.Option(
    False,
    "--requeue/--no-requeue",
    help="Under --slurm: after a preemption notice, requeue the Slurm job to resume.",
)


def version() -> str:
    """ftrun's version, from its package metadata (pyproject.toml)."""
    try:
        return metadata.version("ftrun")
    except metadata.PackageNotFoundError:  # run from a checkout that is not installed
        from ftrun import __version__

        return __version__


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"ftrun {version()}")
        raise typer.Exit()


# `ftrun --version` and `ftrun launch --version`.
VERSION: Any = typer.Option(
    False, "--version", callback=_print_version, is_eager=True, help="Print ftrun's version."
)

# Parameter name → option, in the order the flags are written.
PASSED_ON: dict[str, OptionInfo] = {
    "nproc_per_node": NPROC_PER_NODE,
    "max_restarts": MAX_RESTARTS,
    "module": MODULE,
    "no_python": NO_PYTHON,
    "progress_regex": PROGRESS_REGEX,
    "term_timeout": TERM_TIMEOUT,
    "forward_signal": FORWARD_SIGNAL,
    "env": ENV,
    "env_file": ENV_FILE,
    "exit_timeout": EXIT_TIMEOUT,
    "idle_timeout": IDLE_TIMEOUT,
    "warm_start": WARM_START,
    "policy": POLICY,
    "startup_timeout": STARTUP_TIMEOUT,
    "hang_floor": HANG_FLOOR,
    "hang_factor": HANG_FACTOR,
    "heartbeat_interval": HEARTBEAT_INTERVAL,
    "host_lost_timeout": HOST_LOST_TIMEOUT,
    "fence_timeout": FENCE_TIMEOUT,
    "local_stall_timeout": LOCAL_STALL_TIMEOUT,
    "profile": PROFILE,
    "global_batch": GLOBAL_BATCH,
    "device_memory": DEVICE_MEMORY,
    "replan_horizon": REPLAN_HORIZON,
    "stragglers": STRAGGLERS,
    "group_readable": GROUP_READABLE,
    "insecure_plain_control": INSECURE_PLAIN_CONTROL,
}


def argv(values: Mapping[str, Any]) -> list[str]:
    """The `ftrun launch` flags for these values (by parameter name, those of PASSED_ON); a
    value that is the option's default is left out, so the step shows what the user chose."""
    out: list[str] = []
    for name, option in PASSED_ON.items():
        value = values.get(name, option.default)
        if value is None or value == option.default or value == []:
            continue
        flag = next(d for d in option.param_decls or () if d.startswith("-"))
        if isinstance(value, bool):
            on, _, off = flag.partition("/")
            if off:
                out.append(on if value else off)
            elif value:
                out.append(flag)
        elif isinstance(value, (list, tuple)):
            for item in value:
                out += [flag, _text(item)]
        else:
            out += [flag, _text(value)]
    return out


def _text(value: object) -> str:
    """60.0 → 60: the flag as a person would type it (click reads either)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
