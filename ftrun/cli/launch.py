"""`ftrun launch`: where users typed torchrun. Flags → LaunchConfig → Supervisor."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
import os
import shutil
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path

import typer

from ftrun import envcontract
from ftrun.cli.render import ConsoleReporter, make_console, print_root_cause
from ftrun.config import LaunchConfig, new_job_id, resolve_run_dir, signal_name
from ftrun.controller.policy_file import FaultPolicy, load_policy
from ftrun.envcontract import forwarded
from ftrun.errors import UsageError
from ftrun.hostlist import LOCALHOST, check_roles, parse_host_list, read_hostfile, uniform_slots
from ftrun.timeouts import FLAGS as TIMEOUT_FLAGS
from ftrun.timeouts import ControlTimeouts
from ftrun.userenv import user_env

console = make_console(stderr=True)


def launch(
    script: str = typer.Argument(
        ..., metavar="SCRIPT", help="The training script (or module with -m)."
    ),
    script_args: list[str] | None = typer.Argument(
        None, metavar="[ARGS]...", help="Arguments for the script."
    ),
    nproc_per_node: int = typer.Option(
        1, "--nproc-per-node", "--nproc_per_node", help="Ranks per host."
    ),
    max_restarts: int = typer.Option(
        3, "--max-restarts", "--max_restarts", help="Job-wide restart budget."
    ),
    job_name: str | None = typer.Option(None, "--job-name", help="Name shown by status."),
    run_dir: Path | None = typer.Option(
        None,
        "--run-dir",
        envvar=envcontract.RUN_DIR,
        help="Where job directories go [default: ~/.ftrun/runs].",
    ),
    module: bool = typer.Option(False, "-m", "--module", help="Run SCRIPT as a Python module."),
    no_python: bool = typer.Option(
        False, "--no-python", "--no_python", help="Run SCRIPT as an executable, not with python."
    ),
    master_port: int | None = typer.Option(
        None,
        "--master-port",
        "--master_port",
        help="Rendezvous port [default: a free one per generation].",
    ),
    progress_regex: str | None = typer.Option(
        None, "--progress-regex", help="Derive step progress from output, e.g. 'step (\\d+)'."
    ),
    term_timeout: float | None = typer.Option(
        None,
        "--term-timeout",
        help="Seconds ranks get between SIGTERM and SIGKILL when the job is stopped [5].",
    ),
    grace_period: float | None = typer.Option(
        None, "--grace-period", hidden=True, help="The old name of --term-timeout."
    ),
    forward_signal: list[str] | None = typer.Option(
        None,
        "--forward-signal",
        metavar="SIGS",
        help="Signals passed on to every rank, e.g. USR1,USR2 (preemption notices).",
    ),
    env: list[str] | None = typer.Option(
        None,
        "--env",
        metavar="NAME[=VALUE]",
        help="A variable for the ranks on every host: NAME=VALUE, or NAME to pass on its value "
        "here. Repeatable.",
    ),
    env_file: list[Path] | None = typer.Option(
        None,
        "--env-file",
        metavar="FILE",
        help="NAME=VALUE lines (# comments) for the ranks on every host; --env wins. Repeatable.",
    ),
    exit_timeout: float = typer.Option(
        60.0,
        "--exit-timeout",
        envvar=envcontract.EXIT_TIMEOUT,
        help="Once a rank exits 0, seconds the others have to exit before their stacks are "
        "taken and they are killed.",
    ),
    idle_timeout: float = typer.Option(
        1800.0,
        "--idle-timeout",
        envvar=envcontract.IDLE_TIMEOUT,
        help="Without a progress signal: seconds every rank may go without CPU or output "
        "before it counts as a hang (0: off).",
    ),
    warm_start: bool = typer.Option(
        True, "--warm-start/--cold-start", help="Fork ranks from a pre-imported interpreter."
    ),
    policy: Path | None = typer.Option(
        None, "--policy", help="A TOML fault policy (rules, quarantine, hang)."
    ),
    startup_timeout: float | None = typer.Option(
        None, "--startup-timeout", help="Seconds a rank may take to its first step [300]."
    ),
    hang_floor: float | None = typer.Option(
        None, "--hang-floor", help="A rank is hung after max(floor, factor x step time) [2]."
    ),
    hang_factor: float | None = typer.Option(None, "--hang-factor", help="See --hang-floor [5]."),
    heartbeat_interval: float | None = typer.Option(
        None, "--heartbeat-interval", help="Seconds between heartbeats, both ways [0.25]."
    ),
    host_lost_timeout: float | None = typer.Option(
        None,
        "--host-lost-timeout",
        help="Seconds of silence before a host is lost [1.0]; see docs/timeouts.md.",
    ),
    fence_timeout: float | None = typer.Option(
        None,
        "--fence-timeout",
        help="Seconds without the controller before an agent kills its ranks [3.0].",
    ),
    local_stall_timeout: float | None = typer.Option(
        None,
        "--local-stall-timeout",
        help="Seconds a local agent may be alive but silent before it is lost anyway; 0 = never [60].",
    ),
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
    ssh_config: Path | None = typer.Option(
        None, "--ssh-config", envvar=envcontract.SSH_CONFIG, help="ssh config file [~/.ssh/config]."
    ),
    remote_python: str | None = typer.Option(
        None, "--remote-python", help="Python on the hosts (default: the same path as here)."
    ),
    controller_addr: str | None = typer.Option(
        None,
        "--controller-addr",
        help="Address hosts dial to reach this machine (default: found per host).",
    ),
) -> None:
    """Run SCRIPT under torchrun on this host or on --hosts over ssh; restart it in place when
    a rank fails, replace or shrink around a lost host."""
    problems = _check_entrypoint(script, module=module, no_python=no_python)
    host_list = _host_options(hosts, hostfile, spares, ssh_config, problems)
    if host_list.slots is not None:
        nproc_per_node = host_list.slots
    if master_port is not None and 0 < master_port < 65536 and _port_busy(master_port):
        problems.append(f"--master-port {master_port} is already in use")
    resolved_run_dir = resolve_run_dir(run_dir)
    name = job_name or Path(script).stem or script
    fault_policy = _fault_policy(policy, startup_timeout, hang_floor, hang_factor, problems)
    rank_env, env_problems = user_env(env_file or (), env or (), os.environ)
    problems.extend(env_problems)
    if term_timeout is not None and grace_period is not None:
        problems.append("--grace-period is the old name of --term-timeout: give one of them")
    timeouts = _control_timeouts(
        fault_policy.timeouts,
        heartbeat_interval=heartbeat_interval,
        host_lost_timeout=host_lost_timeout,
        fence_timeout=fence_timeout,
        local_stall_timeout=local_stall_timeout,
    )
    try:
        config = LaunchConfig(
            job_id=new_job_id(name),
            job_name=name,
            run_dir=resolved_run_dir,
            script=script,
            script_args=tuple(script_args or ()),
            module=module,
            no_python=no_python,
            nproc_per_node=nproc_per_node,
            max_restarts=max_restarts,
            master_port=master_port,
            progress_regex=progress_regex,
            term_timeout_s=_first(term_timeout, grace_period, default=5.0),
            forward_signals=_signal_names(forward_signal or ()),
            env=rank_env,
            forward_env=tuple(forwarded(os.environ).items()),
            zygote_preload=os.environ.get(envcontract.ZYGOTE_PRELOAD, ""),
            exit_timeout_s=exit_timeout,
            idle_timeout_s=idle_timeout,
            warm_start=warm_start,
            hosts=host_list.hosts,
            spares=host_list.spares,
            min_nodes=min_nodes if min_nodes is not None else 1,
            ssh=host_list.ssh,
            remote_python=remote_python,
            ssh_config=str(ssh_config) if ssh_config else None,
            controller_addr=controller_addr,
            heartbeat_interval_s=timeouts.heartbeat_interval_s,
            host_lost_timeout_s=timeouts.host_lost_timeout_s,
            fence_timeout_s=timeouts.fence_timeout_s,
            local_stall_timeout_s=timeouts.local_stall_timeout_s,
        )
    except UsageError as e:
        problems.insert(0, e.message)
    if problems:
        raise UsageError("; ".join(problems), hint=_hint(problems))
    _check_run_dir(resolved_run_dir)
    code = run(config, fault_policy)
    if code:  # typer.Exit carries the job's exit code through typer's standalone mode
        raise typer.Exit(code)


def run(config: LaunchConfig, policy: FaultPolicy) -> int:
    from ftrun.controller.supervisor import Supervisor
    from ftrun.journal import Journal
    from ftrun.transport.local import LocalTransport
    from ftrun.transport.ssh import SshTransport

    journal = Journal(config.job_dir)
    journal.write_config({**config.to_json(), "policy": dataclasses.asdict(policy)})
    handler = logging.FileHandler(config.job_dir / "controller.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.getLogger("ftrun").addHandler(handler)
    logging.getLogger("ftrun").setLevel(logging.INFO)
    reporter = ConsoleReporter(console)
    reporter.notice(f"job {config.job_id} (directory {config.job_dir})")
    try:
        transport = (
            SshTransport(
                python=config.agent_python,
                ssh_config=config.ssh_config,
                controller_addr=config.controller_addr,
            )
            if config.ssh
            else LocalTransport(config.python)
        )
        supervisor = Supervisor(
            config, policy=policy, journal=journal, transport=transport, reporter=reporter
        )
        outcome = asyncio.run(supervisor.run())
    finally:
        journal.close()
        logging.getLogger("ftrun").removeHandler(handler)
        handler.close()
    level = {"succeeded": "info", "stopped": "warning"}.get(outcome.state, "error")
    reporter.notice(f"job {config.job_id} {outcome.state}: {outcome.reason}", level=level)
    print_root_cause(console, outcome.root_cause)
    if outcome.state != "succeeded":
        run_dir_flag = (
            "" if config.run_dir == resolve_run_dir(None) else f" --run-dir {config.run_dir}"
        )
        reporter.notice(f"see `ftrun inspect {config.job_id}{run_dir_flag}`")
    return outcome.exit_code


@dataclasses.dataclass(frozen=True)
class _Hosts:
    hosts: tuple[str, ...] = (LOCALHOST,)
    spares: tuple[str, ...] = ()
    ssh: bool = False
    slots: int | None = None


def _host_options(
    hosts: str | None,
    hostfile: Path | None,
    spares: str | None,
    ssh_config: Path | None,
    problems: list[str],
) -> _Hosts:
    """--hosts / --hostfile / --spares → host targets; problems are collected, not raised."""
    if hosts is not None and hostfile is not None:
        problems.append("--hosts and --hostfile cannot be used together")
        return _Hosts()
    if ssh_config is not None:
        problems.extend(_ssh_config_problems(ssh_config))
    try:
        entries = (
            read_hostfile(hostfile)
            if hostfile is not None
            else parse_host_list(hosts)
            if hosts is not None
            else []
        )
        spare_entries = parse_host_list(spares, what="--spares") if spares else []
        if hosts is not None and not entries:
            problems.append("--hosts names no host")
        if not entries:
            return _Hosts(spares=tuple(e.target for e in spare_entries))
        check_roles(entries, spare_entries, None)
        return _Hosts(
            tuple(e.target for e in entries),
            tuple(e.target for e in spare_entries),
            ssh=True,
            slots=uniform_slots(entries),
        )  # spares run as many
    except UsageError as e:
        problems.append(e.message)
        return _Hosts()


def _ssh_config_problems(path: Path) -> list[str]:
    if not path.is_file():
        return [f"--ssh-config {str(path)!r} is not a file"]
    import paramiko  # what Fabric parses it with

    try:
        paramiko.SSHConfig.from_path(str(path))
    except Exception as e:  # noqa: BLE001 - ConfigParseError, or an unreadable file
        return [f"--ssh-config {str(path)!r} cannot be parsed: {e}"]
    return []


def _fault_policy(
    path: Path | None,
    startup_timeout: float | None,
    hang_floor: float | None,
    hang_factor: float | None,
    problems: list[str],
) -> FaultPolicy:
    """The policy file (if any) with the hang flags on top: a flag beats the file."""
    policy = FaultPolicy()
    if path is not None:
        try:
            policy = load_policy(path)
        except UsageError as e:
            problems.append(e.message)
    hang = policy.hang
    for name, value in (
        ("--startup-timeout", startup_timeout),
        ("--hang-floor", hang_floor),
        ("--hang-factor", hang_factor),
    ):
        if value is not None and value < 0:
            problems.append(f"{name} must be 0 or more (got {value:g})")
    if startup_timeout is not None:
        hang = dataclasses.replace(hang, startup_timeout_s=startup_timeout, expect_progress=True)
    if hang_floor is not None:
        hang = dataclasses.replace(hang, floor_s=hang_floor)
    if hang_factor is not None:
        hang = dataclasses.replace(hang, factor=hang_factor)
    return dataclasses.replace(policy, hang=hang)


def _control_timeouts(
    file: Mapping[str, float],
    *,
    heartbeat_interval: float | None,
    host_lost_timeout: float | None,
    fence_timeout: float | None,
    local_stall_timeout: float | None,
) -> ControlTimeouts:
    """The control plane's timing: a flag beats the policy file's [timeouts] beats the default
    (checked by LaunchConfig)."""
    default = ControlTimeouts()
    return ControlTimeouts(
        heartbeat_interval_s=_first(
            heartbeat_interval,
            file.get("heartbeat_interval_s"),
            default=default.heartbeat_interval_s,
        ),
        host_lost_timeout_s=_first(
            host_lost_timeout,
            file.get("host_lost_timeout_s"),
            default=default.host_lost_timeout_s,
        ),
        fence_timeout_s=_first(
            fence_timeout, file.get("fence_timeout_s"), default=default.fence_timeout_s
        ),
        local_stall_timeout_s=_first(
            local_stall_timeout,
            file.get("local_stall_timeout_s"),
            default=default.local_stall_timeout_s,
        ),
    )


def _signal_names(values: Iterable[str]) -> tuple[str, ...]:
    """--forward-signal USR1,USR2 --forward-signal hup → SIGUSR1, SIGUSR2, SIGHUP (checked by
    LaunchConfig)."""
    return tuple(dict.fromkeys(signal_name(s) for v in values for s in v.split(",") if s.strip()))


def _first(*values: float | None, default: float) -> float:
    return next((v for v in values if v is not None), default)


def _check_entrypoint(script: str, *, module: bool, no_python: bool) -> list[str]:
    if module and no_python:
        return ["-m and --no-python cannot be used together"]
    if module:
        return []
    if no_python:
        if os.sep in script:
            ok = os.path.isfile(script) and os.access(script, os.X_OK)
        else:
            ok = shutil.which(script) is not None
        return [] if ok else [f"{script!r} is not an executable file"]
    if not os.path.isfile(script):
        return [f"no such script: {script!r}"]
    return []


def _port_busy(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE or e.errno == errno.EACCES
    return False


def _check_run_dir(run_dir: Path) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".ftrun-write-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UsageError(
            f"the run directory {run_dir} is not writable: {e.strerror or e}",
            hint="pass a writable --run-dir or set FTRUN_RUN_DIR",
        ) from None


def _hint(problems: list[str]) -> str:
    if any("--env" in p or "env-file" in p for p in problems):
        return (
            "--env NAME=VALUE or --env NAME (its value here); an --env-file has NAME=VALUE "
            "lines and # comments; see docs/multihost.md"
        )
    if any("in use" in p for p in problems):
        return "pick another --master-port, or leave it out to get a free port per generation"
    if any(flag in p for p in problems for flag in TIMEOUT_FLAGS.values()):
        return "see docs/timeouts.md for how to choose the heartbeat, lost and fence timeouts"
    if any("policy" in p for p in problems):
        return "see docs/policy.md for the policy file format"
    if any("host" in p or "spares" in p or "min-nodes" in p for p in problems):
        return (
            "hosts are `host`, `user@host` or `user@host:port` (comma-separated, or one per "
            "line in a --hostfile); see `ftrun launch --help`"
        )
    if any("script" in p or "executable" in p for p in problems):
        return "check the path; use -m for a module or --no-python for an executable"
    return "see `ftrun launch --help`"


def register(app: typer.Typer) -> None:
    app.command(context_settings={"allow_interspersed_args": False})(launch)
