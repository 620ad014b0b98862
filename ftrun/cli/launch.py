"""`ftrun launch`: where users typed torchrun. Flags → LaunchConfig → Supervisor.

The flags are checked and resolved by launch_inputs.py, launch_hosts.py and launch_job_id.py,
torchrun's own by torchrun_flags.py; the configured job runs as `ftrun resume` runs one too
(run_job.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from ftrun import envcontract
from ftrun.cli import launch_hosts, launch_job_id
from ftrun.cli import launch_inputs as inputs
from ftrun.cli import launch_options as opts
from ftrun.cli import torchrun_flags as tr
from ftrun.cli.render import ConsoleReporter
from ftrun.cli.run_job import console, run
from ftrun.cli.torchrun_values import nproc_per_node_of
from ftrun.config import LaunchConfig, new_job_id, resolve_run_dir, signal_name
from ftrun.envcontract import forwarded
from ftrun.errors import UsageError
from ftrun.transport.registry import options_from
from ftrun.transport.slurm_allocation import in_allocation
from ftrun.userenv import user_env


def launch(
    script: str = typer.Argument(
        ..., metavar="SCRIPT", help="The training script (or module with -m)."
    ),
    script_args: list[str] | None = typer.Argument(
        None, metavar="[ARGS]...", help="Arguments for the script."
    ),
    nproc_per_node: str | None = opts.NPROC_PER_NODE,
    max_restarts: int = opts.MAX_RESTARTS,
    job_name: str | None = opts.JOB_NAME,
    run_dir: Path | None = opts.RUN_DIR,
    module: bool = opts.MODULE,
    no_python: bool = opts.NO_PYTHON,
    master_port: int | None = opts.MASTER_PORT,
    progress_regex: str | None = opts.PROGRESS_REGEX,
    term_timeout: float | None = opts.TERM_TIMEOUT,
    grace_period: float | None = opts.GRACE_PERIOD,
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
    controller_grace: float = opts.CONTROLLER_GRACE,
    standby: str | None = opts.STANDBY,
    no_standby: bool = opts.NO_STANDBY,
    peer_copy_rate: float = opts.PEER_COPY_RATE,
    local_stall_timeout: float | None = opts.LOCAL_STALL_TIMEOUT,
    profile: Path | None = opts.PROFILE,
    global_batch: int | None = opts.GLOBAL_BATCH,
    device_memory: str | None = opts.DEVICE_MEMORY,
    replan_horizon: float = opts.REPLAN_HORIZON,
    stragglers: str = opts.STRAGGLERS,
    group_readable: bool = opts.GROUP_READABLE,
    insecure_plain_control: bool = opts.INSECURE_PLAIN_CONTROL,
    link_check: bool = opts.LINK_CHECK,
    hosts: str | None = typer.Option(
        None, "--hosts", help="Hosts to run on over ssh: a,b,user@c:2222 (default: this machine)."
    ),
    hostfile: Path | None = typer.Option(
        None, "--hostfile", help="One host per line, `host slots=N` (slots optional), # comments."
    ),
    spares: str | None = typer.Option(
        None, "--spares", help="Hosts that wait, ready, to replace a lost one: d,e."
    ),
    min_nodes: int | None = typer.Option(
        None, "--min-nodes", help="Fewest hosts the job may shrink to [1]."
    ),
    metrics_port: int | None = typer.Option(
        None,
        "--metrics-port",
        help="Serve the job's figures for Prometheus on this port (0: any free one).",
    ),
    metrics_addr: str = typer.Option(
        "127.0.0.1", "--metrics-addr", help="Address the metrics are served on."
    ),
    max_nodes: int | None = typer.Option(
        None,
        "--max-nodes",
        help="Most hosts the job grows to as `ftrun hosts add` brings more [the --hosts count].",
    ),
    ssh_config: Path | None = typer.Option(
        None, "--ssh-config", envvar=envcontract.SSH_CONFIG, help="ssh config file [~/.ssh/config]."
    ),
    insecure_skip_host_key_check: bool = typer.Option(
        False,
        "--insecure-skip-host-key-check",
        help="Accept any ssh host key, even an unknown or changed one (INSECURE: whoever "
        "answers on a host's address gets the job and its secret) [check known_hosts].",
    ),
    remote_python: str | None = typer.Option(
        None, "--remote-python", help="Python on the hosts (default: the same path as here)."
    ),
    controller_addr: str | None = typer.Option(
        None,
        "--controller-addr",
        help="Address hosts dial to reach this machine (default: found per host).",
    ),
    slurm: bool | None = opts.SLURM,
    slurm_spares: int = opts.SLURM_SPARES,
    job_id: str | None = opts.JOB_ID,
    preempt_signal: str = opts.PREEMPT_SIGNAL,
    preempt_grace: float = opts.PREEMPT_GRACE,
    requeue: bool = opts.REQUEUE,
    torchrun: tr.TorchrunFlags = tr.TorchrunFlags(),  # torchrun's other flags: see register()
) -> None:
    """Run SCRIPT under torchrun on this host or on --hosts over ssh; restart it in place when
    a rank fails, replace or shrink around a lost host. Takes torchrun's flags too
    (docs/torchrun.md)."""
    module, no_python = torchrun.entrypoint(module=module, no_python=no_python)
    problems = inputs.check_entrypoint(script, module=module, no_python=no_python)
    if slurm is None:
        slurm = in_allocation() and hosts is None and hostfile is None
    host_list = (
        launch_hosts.slurm_hosts(hosts, hostfile, spares, slurm_spares, problems)
        if slurm
        else launch_hosts.host_options(hosts, hostfile, spares, ssh_config, problems)
    )
    allocation = host_list.allocation
    if not (standby and allocation is not None):  # said below, with the other Slurm checks
        standby = launch_hosts.default_standby(host_list, standby, no_standby, problems)
    gpus = allocation.gpus_per_node if allocation else None
    min_nodes, max_nodes = torchrun.nodes(
        host_list.hosts,
        transport=host_list.transport,
        named=hosts is not None or hostfile is not None,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        problems=problems,
    )
    nproc = nproc_per_node_of(nproc_per_node, gpus=gpus, problems=problems)
    if host_list.slots is not None:
        nproc = host_list.slots
    if nproc is None:
        nproc = 1 if nproc_per_node is not None else gpus or 1
    if master_port is not None and 0 < master_port < 65536 and inputs.port_busy(master_port):
        problems.append(f"--master-port {master_port} is already in use")
    resolved_run_dir = resolve_run_dir(run_dir)
    run_dir_ok = launch_job_id.run_dir_path(resolved_run_dir, problems)
    name = job_name or Path(script).stem or script
    if job_id is None and allocation is not None and run_dir_ok:
        job_id = launch_job_id.slurm_job_id(resolved_run_dir, name, allocation)
    resume = launch_job_id.resume_point(
        resolved_run_dir,
        job_id,
        problems,
        slurm_restarts=allocation.restart_count if allocation else None,
    )
    fault_policy = inputs.fault_policy(policy, startup_timeout, hang_floor, hang_factor, problems)
    rank_env, env_problems = user_env(env_file or (), env or (), os.environ)
    problems.extend(env_problems)
    if term_timeout is not None and grace_period is not None:
        problems.append("--grace-period is the old name of --term-timeout: give one of them")
    term_timeout = torchrun.term_timeout(term_timeout, problems)
    echo = torchrun.echo(problems)
    torchrun.check_log_dir(problems)
    timeouts = inputs.control_timeouts(
        fault_policy.timeouts,
        heartbeat_interval=heartbeat_interval,
        host_lost_timeout=host_lost_timeout,
        fence_timeout=fence_timeout,
        local_stall_timeout=local_stall_timeout,
    )
    device_memory_bytes = inputs.planning(profile, global_batch, device_memory, problems)
    try:
        config = LaunchConfig(
            job_id=job_id or new_job_id(name),
            job_name=name,
            run_dir=resolved_run_dir,
            script=script,
            script_args=tuple(script_args or ()),
            module=module,
            no_python=no_python,
            nproc_per_node=nproc,
            max_restarts=max_restarts,
            master_port=master_port,
            progress_regex=progress_regex,
            term_timeout_s=inputs.first(term_timeout, grace_period, default=5.0),
            forward_signals=inputs.signal_names(forward_signal or ()),
            env=rank_env,
            forward_env=tuple(forwarded(os.environ).items()),
            zygote_preload=os.environ.get(envcontract.ZYGOTE_PRELOAD, ""),
            exit_timeout_s=exit_timeout,
            idle_timeout_s=idle_timeout,
            warm_start=warm_start,
            hosts=host_list.hosts,
            spares=host_list.spares,
            min_nodes=min_nodes if min_nodes is not None else 1,
            max_nodes=max_nodes,
            metrics_port=metrics_port,
            metrics_addr=metrics_addr,
            transport=host_list.transport,
            remote_python=remote_python,
            transport_options=options_from(
                host_list.transport,
                {
                    "ssh_config": str(ssh_config) if ssh_config else None,
                    "check_host_keys": not insecure_skip_host_key_check,
                    "slurm_job_id": allocation.job_id if allocation else None,
                    "slurm_restart_count": allocation.restart_count if allocation else 0,
                    "gpus_per_node": gpus,
                },
            ),
            controller_addr=controller_addr,
            heartbeat_interval_s=timeouts.heartbeat_interval_s,
            host_lost_timeout_s=timeouts.host_lost_timeout_s,
            fence_timeout_s=timeouts.fence_timeout_s,
            controller_grace_s=controller_grace,
            standby=standby,
            peer_copy_mbps=peer_copy_rate,
            local_stall_timeout_s=timeouts.local_stall_timeout_s,
            preempt_signal=signal_name(preempt_signal),
            preempt_grace_s=preempt_grace,
            requeue=requeue,
            profile=str(profile.resolve()) if profile is not None else None,
            global_batch=global_batch,
            device_memory_bytes=device_memory_bytes,
            replan_horizon_s=replan_horizon,
            stragglers=stragglers,
            group_readable=group_readable,
            control_tls=not insecure_plain_control,
            link_check=link_check,
        )
    except UsageError as e:
        problems.insert(0, e.message)
    if problems:
        raise UsageError("; ".join(problems), hint=inputs.hint(problems))
    if standby and allocation is not None:
        problems.append(
            "--standby is for ssh hosts: under Slurm the agents requeue a job whose batch node "
            "is lost (docs/slurm.md)"
        )
    if requeue and allocation is None:
        problems.append("--requeue needs --slurm (only a Slurm job can be requeued)")
    if problems:
        raise UsageError("; ".join(problems), hint=inputs.hint(problems))
    # Before anything is written: the controller's files are the user's only (ftrun/filemodes.py).
    os.umask(config.umask)
    inputs.check_run_dir(resolved_run_dir, config.umask)
    torchrun.announce(ConsoleReporter(console), config)
    code = run(config, fault_policy, resume, echo=echo)
    if code:  # typer.Exit carries the job's exit code through typer's standalone mode
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    # With torchrun's flags (cli/torchrun_flags.py): `torchrun` in a command line is `ftrun launch`.
    command = tr.accept_torchrun_flags(launch)
    app.command("launch", context_settings={"allow_interspersed_args": False})(command)
