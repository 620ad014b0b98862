"""`ftrun sbatch`: where users wrote a batch script around `srun torchrun`. Flags → BatchScript →
<job dir>/sbatch.sh → `sbatch --parsable`; it prints the Slurm and ftrun job ids and returns.

The job id and directory are chosen here, at submission, so the user can follow the job from the
moment it is queued and the batch step (`ftrun launch --slurm`, docs/slurm.md) writes into the
same directory. The launch options it passes on are checked here as `ftrun launch` checks them,
so a typo is reported now rather than after the wait in the queue.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import typer
from rich.text import Text

from ftrun import filemodes, jobfiles
from ftrun.cli import launch_inputs as inputs
from ftrun.cli import launch_options as opts
from ftrun.cli.batch_script import BatchScript, parse_signal, parse_time
from ftrun.cli.render import make_console
from ftrun.config import LaunchConfig, new_job_id, resolve_run_dir
from ftrun.errors import FtrunError, UsageError
from ftrun.quarantine import QuarantineStore
from ftrun.userenv import user_env

console = make_console()
err_console = make_console(stderr=True)
SBATCH_TIMEOUT_S = 30.0
SLURM_FLAGS = ("--nodes", "--spares", "--gpus-per-node", "--time", "--signal", "--sbatch-arg")


def sbatch(
    script: str = typer.Argument(
        ..., metavar="SCRIPT", help="The training script (or module with -m)."
    ),
    script_args: list[str] | None = typer.Argument(
        None, metavar="[ARGS]...", help="Arguments for the script."
    ),
    nodes: int = typer.Option(1, "--nodes", help="Training nodes."),
    spares: int = typer.Option(
        0, "--spares", help="More nodes in the allocation that wait, ready, to replace a lost one."
    ),
    time: str | None = typer.Option(
        None, "--time", help="Time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS."
    ),
    partition: str | None = typer.Option(None, "--partition", help="Slurm partition."),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", help="GPUs on each node."),
    signal_spec: str = typer.Option(
        "USR2@90",
        "--signal",
        metavar="[B:]NAME@SECONDS",
        help="The notice the controller gets before the time limit; the ranks get SECONDS less "
        "a margin to checkpoint (docs/slurm.md).",
    ),
    requeue: bool = typer.Option(
        True, "--requeue/--no-requeue", help="Requeue the job when it is preempted."
    ),
    sbatch_arg: list[str] | None = typer.Option(
        None,
        "--sbatch-arg",
        metavar="OPTION",
        help="A raw #SBATCH option, e.g. --sbatch-arg=--qos=high. Repeatable.",
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the batch script; write and submit nothing."
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    job_name: str | None = opts.JOB_NAME,
    run_dir: Path | None = opts.RUN_DIR,
    nproc_per_node: int | None = opts.NPROC_PER_NODE,
    max_restarts: int = opts.MAX_RESTARTS,
    module: bool = opts.MODULE,
    no_python: bool = opts.NO_PYTHON,
    progress_regex: str | None = opts.PROGRESS_REGEX,
    term_timeout: float | None = opts.TERM_TIMEOUT,
    forward_signal: list[str] | None = opts.FORWARD_SIGNAL,
    env: list[str] | None = opts.ENV,
    env_file: list[Path] | None = opts.ENV_FILE,
    exit_timeout: float = opts.EXIT_TIMEOUT,
    idle_timeout: float = opts.IDLE_TIMEOUT,
    warm_start: bool = opts.WARM_START,
    policy: Path | None = opts.POLICY,
    startup_timeout: float | None = opts.STARTUP_TIMEOUT,
    hang_floor: float | None = opts.HANG_FLOOR,
    hang_factor: float | None = opts.HANG_FACTOR,
    heartbeat_interval: float | None = opts.HEARTBEAT_INTERVAL,
    host_lost_timeout: float | None = opts.HOST_LOST_TIMEOUT,
    fence_timeout: float | None = opts.FENCE_TIMEOUT,
    local_stall_timeout: float | None = opts.LOCAL_STALL_TIMEOUT,
    profile: Path | None = opts.PROFILE,
    global_batch: int | None = opts.GLOBAL_BATCH,
    device_memory: str | None = opts.DEVICE_MEMORY,
    replan_horizon: float = opts.REPLAN_HORIZON,
    stragglers: str = opts.STRAGGLERS,
    group_readable: bool = opts.GROUP_READABLE,
    insecure_plain_control: bool = opts.INSECURE_PLAIN_CONTROL,
) -> None:
    """Submit SCRIPT as a Slurm batch job that runs `ftrun launch` on NODES nodes (+ SPARES):
    a failed node is replaced, a preempted job checkpoints and requeues."""
    # First, while locals() holds only the parameters: the launch options by name.
    launch_values = {name: value for name, value in locals().items() if name in opts.PASSED_ON}
    problems = slurm_problems(nodes, spares, gpus_per_node, sbatch_arg or ())
    notice = parse_signal(signal_spec, problems)
    limit_s = parse_time(time, problems) if time is not None else None
    if limit_s and notice.seconds >= limit_s:
        problems.append(
            f"--signal {signal_spec} comes {notice.seconds} s before the end of a "
            f"--time {time} ({limit_s} s) job: give a shorter notice or more time"
        )
    if dry_run and as_json:
        problems.append("--dry-run prints the script and --json a submission: give one")
    name = job_name or Path(script).stem or script
    resolved_run_dir = resolve_run_dir(run_dir)
    job_id = new_job_id(name)
    problems += launch_problems(script, job_id, name, resolved_run_dir, launch_values)
    if problems:
        raise UsageError("; ".join(problems), hint=hint(problems))
    batch = BatchScript(
        job_id=job_id,
        job_name=name,
        run_dir=resolved_run_dir,
        cwd=os.getcwd(),
        python=sys.executable,
        script=script,
        script_args=tuple(script_args or ()),
        nodes=nodes,
        spares=spares,
        time=time,
        partition=partition,
        gpus_per_node=gpus_per_node,
        signal=notice,
        requeue=requeue,
        exclude=quarantined_nodes(),
        sbatch_args=tuple(sbatch_arg or ()),
        launch_args=tuple(opts.argv(launch_values)),
    )
    broken = batch.line_breakers()
    if broken:
        raise UsageError(
            f"{', '.join(broken)}: a line break or another control character, which would end "
            "its line of the batch script and run the rest as a command",
            hint="remove it; run `ftrun sbatch` from a directory whose path has none",
        )
    if dry_run:
        sys.stdout.write(batch.render())
        err_console.print(
            Text(
                "dry run: nothing written, nothing submitted (a submission picks a new job id)",
                "dim",
            )
        )
        return
    executable = shutil.which("sbatch")
    if executable is None:
        raise UsageError(
            "sbatch not found: ftrun sbatch needs a Slurm cluster's client commands",
            hint="run it on a Slurm login node; `ftrun sbatch --dry-run ...` shows the script "
            "anywhere",
        )
    umask = filemodes.umask_for(group_readable)
    os.umask(umask)  # the batch script and the job directory are the user's (ftrun/filemodes.py)
    inputs.check_run_dir(resolved_run_dir, umask)
    with jobfiles.JobDir.open(batch.job_dir, umask=umask) as files:  # new, 0700: ours alone
        with open(files.create_new(batch.path.name), "w", encoding="utf-8") as f:
            f.write(batch.render())
    slurm_job_id = submit(executable, batch.path)
    report(batch, slurm_job_id, as_json=as_json)


def slurm_problems(
    nodes: int, spares: int, gpus_per_node: int | None, sbatch_args: tuple[str, ...] | list[str]
) -> list[str]:
    problems = []
    if nodes < 1:
        problems.append(f"--nodes must be at least 1 (got {nodes})")
    if spares < 0:
        problems.append(f"--spares must be 0 or more (got {spares})")
    if gpus_per_node is not None and gpus_per_node < 1:
        problems.append(f"--gpus-per-node must be at least 1 (got {gpus_per_node})")
    for arg in sbatch_args:
        if not arg.startswith("-") or "\n" in arg:
            problems.append(
                f"--sbatch-arg takes one sbatch option such as --qos=high (got {arg!r})"
            )
    return problems


def launch_problems(
    script: str, job_id: str, name: str, run_dir: Path, values: dict[str, Any]
) -> list[str]:
    """What `ftrun launch` would reject in the options passed on, found before the queue."""
    problems = inputs.check_entrypoint(
        script, module=values["module"], no_python=values["no_python"]
    )
    policy = inputs.fault_policy(
        values["policy"],
        values["startup_timeout"],
        values["hang_floor"],
        values["hang_factor"],
        problems,
    )
    _, env_problems = user_env(values["env_file"] or (), values["env"] or (), os.environ)
    problems += env_problems
    timeouts = inputs.control_timeouts(
        policy.timeouts,
        heartbeat_interval=values["heartbeat_interval"],
        host_lost_timeout=values["host_lost_timeout"],
        fence_timeout=values["fence_timeout"],
        local_stall_timeout=values["local_stall_timeout"],
    )
    device_memory_bytes = inputs.planning(
        values["profile"], values["global_batch"], values["device_memory"], problems
    )
    try:
        LaunchConfig(
            job_id=job_id,
            job_name=name,
            run_dir=run_dir,
            script=script,
            nproc_per_node=1 if values["nproc_per_node"] is None else values["nproc_per_node"],
            max_restarts=values["max_restarts"],
            progress_regex=values["progress_regex"],
            term_timeout_s=inputs.first(values["term_timeout"], default=5.0),
            forward_signals=inputs.signal_names(values["forward_signal"] or ()),
            exit_timeout_s=values["exit_timeout"],
            idle_timeout_s=values["idle_timeout"],
            heartbeat_interval_s=timeouts.heartbeat_interval_s,
            host_lost_timeout_s=timeouts.host_lost_timeout_s,
            fence_timeout_s=timeouts.fence_timeout_s,
            local_stall_timeout_s=timeouts.local_stall_timeout_s,
            profile=str(values["profile"]) if values["profile"] is not None else None,
            global_batch=values["global_batch"],
            device_memory_bytes=device_memory_bytes,
            replan_horizon_s=values["replan_horizon"],
            stragglers=values["stragglers"],
        )
    except UsageError as e:
        problems.insert(0, e.message)
    return problems


def hint(problems: list[str]) -> str:
    if any(flag in p for p in problems for flag in SLURM_FLAGS):
        return "see `ftrun sbatch --help` and docs/slurm.md"
    return inputs.hint(problems).replace("ftrun launch --help", "ftrun sbatch --help")


def submit(executable: str, path: Path) -> str:
    """`sbatch --parsable` the script; its Slurm job id. The job directory stays on failure."""
    kept = f"the script is kept in {path}: fix it and `sbatch {path}`, or run ftrun sbatch again"
    try:
        result = subprocess.run(
            [executable, "--parsable", str(path)],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=SBATCH_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise FtrunError(
            f"sbatch did not answer in {SBATCH_TIMEOUT_S:g} s: the job may or may not be queued",
            hint=f"check `squeue --me`; {kept}",
        ) from None
    # --parsable: "jobid" or "jobid;cluster"
    slurm_job_id = result.stdout.strip().split(";")[0]
    if result.returncode != 0 or not slurm_job_id.isdigit():
        said = (result.stderr.strip() or result.stdout.strip() or "no output").replace("\n", "; ")
        raise FtrunError(f"sbatch failed (exit {result.returncode}): {said}", hint=kept)
    return slurm_job_id


def quarantined_nodes() -> tuple[str, ...]:
    """The Slurm nodes earlier jobs quarantined (not yet expired): the job is not placed there.
    A store that cannot be read is said and left out of it."""
    known, problem = QuarantineStore().load()
    if problem is not None:
        err_console.print(f"warning: {problem}", style="yellow")
    nodes = sorted(host for host, entry in known.items() if entry.transport == "slurm")
    if nodes:
        err_console.print(f"not on {', '.join(nodes)}: quarantined (`ftrun hosts --quarantined`)")
    return tuple(nodes)


def report(batch: BatchScript, slurm_job_id: str, *, as_json: bool) -> None:
    if as_json:
        print(
            json.dumps(
                {
                    "slurm_job_id": slurm_job_id,
                    "job_id": batch.job_id,
                    "job_dir": str(batch.job_dir),
                    "script": str(batch.path),
                },
                indent=2,
            )
        )
        return
    run_dir_flag = "" if batch.run_dir == resolve_run_dir(None) else f" --run-dir {batch.run_dir}"
    # Plain strings: the console parses no markup in them (safetext.py).
    console.print(
        f"submitted Slurm job {slurm_job_id} as ftrun job {batch.job_id} "
        f"(directory {batch.job_dir})",
        soft_wrap=True,
    )
    console.print(
        f"while it waits: `squeue -j {slurm_job_id}`; once it runs: "
        f"`ftrun status {batch.job_id}{run_dir_flag}`; Slurm's output: "
        f"{batch.job_dir / f'slurm-{slurm_job_id}.out'}",
        style="dim",
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    app.command(context_settings={"allow_interspersed_args": False})(sbatch)
