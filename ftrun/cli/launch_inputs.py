"""What `ftrun launch` checks and resolves from its flags before a LaunchConfig exists.

Every check collects its problems into one list instead of raising, so that a user sees all that
is wrong with a command line in one message (STYLE.md), with one hint chosen from them. What the
flags mean and how they combine (a flag beats the policy file beats the default) lives here, with
the hosts in launch_hosts.py and the job (new, Slurm's, resumed) in launch_job_id.py; `launch.py`
only wires flags → LaunchConfig → Supervisor.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path

from ftrun import filemodes, jobfiles, numbers
from ftrun.config import signal_name
from ftrun.controller.policy_file import FaultPolicy, load_policy
from ftrun.errors import FtrunError, UsageError
from ftrun.journal.read import check_run_dir_path
from ftrun.planner import Profile, parse_size
from ftrun.timeouts import FLAGS as TIMEOUT_FLAGS
from ftrun.timeouts import ControlTimeouts


def planning(
    profile: Path | None, global_batch: int | None, device_memory: str | None, problems: list[str]
) -> int | None:
    """--profile must be a profile the planner reads, with a global batch from it or from
    --global-batch; --device-memory a size. Returns the device memory in bytes (None: the
    profile's)."""
    if profile is not None:
        try:
            loaded = Profile.from_dict(json.loads(profile.read_text()))
            if global_batch is None and loaded.global_batch is None:
                problems.append(
                    f"--profile {str(profile)!r} has no global batch: give --global-batch"
                )
        except OSError as e:
            problems.append(f"--profile {str(profile)!r} cannot be read: {e.strerror or e}")
        except ValueError as e:  # JSONDecodeError
            problems.append(f"--profile {str(profile)!r} is not JSON: {e}")
        except FtrunError as e:
            problems.append(f"--profile {str(profile)!r}: {e.message}")
    return device_memory_bytes(device_memory, problems)


def device_memory_bytes(text: str | None, problems: list[str]) -> int | None:
    """--device-memory SIZE in bytes (None when not given), as `launch` and `plan` read it."""
    if text is None:
        return None
    try:
        return parse_size(text)
    except ValueError as e:
        problems.append(f"--device-memory: {e}")
        return None


def fault_policy(
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
        if value is not None and (problem := numbers.problem(name, value, minimum=0)):
            problems.append(problem)
    if startup_timeout is not None:
        hang = dataclasses.replace(hang, startup_timeout_s=startup_timeout, expect_progress=True)
    if hang_floor is not None:
        hang = dataclasses.replace(hang, floor_s=hang_floor)
    if hang_factor is not None:
        hang = dataclasses.replace(hang, factor=hang_factor)
    return dataclasses.replace(policy, hang=hang)


def control_timeouts(
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
        heartbeat_interval_s=first(
            heartbeat_interval,
            file.get("heartbeat_interval_s"),
            default=default.heartbeat_interval_s,
        ),
        host_lost_timeout_s=first(
            host_lost_timeout,
            file.get("host_lost_timeout_s"),
            default=default.host_lost_timeout_s,
        ),
        fence_timeout_s=first(
            fence_timeout, file.get("fence_timeout_s"), default=default.fence_timeout_s
        ),
        local_stall_timeout_s=first(
            local_stall_timeout,
            file.get("local_stall_timeout_s"),
            default=default.local_stall_timeout_s,
        ),
    )


def signal_names(values: Iterable[str]) -> tuple[str, ...]:
    """--forward-signal USR1,USR2 --forward-signal hup → SIGUSR1, SIGUSR2, SIGHUP (checked by
    LaunchConfig)."""
    return tuple(dict.fromkeys(signal_name(s) for v in values for s in v.split(",") if s.strip()))


def first(*values: float | None, default: float) -> float:
    return next((v for v in values if v is not None), default)


def check_entrypoint(script: str, *, module: bool, no_python: bool) -> list[str]:
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


def port_busy(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE or e.errno == errno.EACCES
    return False


def check_run_dir(run_dir: Path, umask: int = filemodes.PRIVATE_UMASK) -> None:
    """The run directory is writable, and no other user can change what is in it
    (ftrun/jobfiles.py); one we create (and its missing parents) gets the mode `umask`
    allows, an existing one is left as the user made it."""
    check_run_dir_path(run_dir)
    jobfiles.check_run_dir(run_dir, umask)


POLICY_PROBLEMS = ("the policy file ", "no policy file ", "cannot read the policy file ")


def hint(problems: list[str]) -> str:
    """The next step for the first family of problems found. A policy file's message quotes the
    file (`kinds must be among [..., 'host-lost']`), so it is told by where it comes from and
    the other families are matched only in the other problems."""
    policy = [p for p in problems if p.startswith(POLICY_PROBLEMS)]
    problems = [p for p in problems if p not in policy]
    if any("--env" in p or "env-file" in p for p in problems):
        return (
            "--env NAME=VALUE or --env NAME (its value here); an --env-file has NAME=VALUE "
            "lines and # comments; see docs/multihost.md"
        )
    if any(p.startswith("job id ") and "in use" in p for p in problems):
        return (
            "a job id names the job's processes and its memory tier on every host, so two jobs "
            "may not share one; leave --job-id out to get a new one"
        )
    if any("in use" in p for p in problems):
        return "pick another --master-port, or leave it out to get a free port per generation"
    if any(flag in p for p in problems for flag in TIMEOUT_FLAGS.values()):
        return "see docs/timeouts.md for how to choose the heartbeat, lost and fence timeouts"
    if policy:
        return "see docs/policy.md for the policy file format"
    if any(p.startswith("the run directory ") for p in problems):
        return "pass a directory to --run-dir or FTRUN_RUN_DIR (default ~/.ftrun/runs)"
    if any(p.startswith(("--nnodes", "--node-rank")) for p in problems):
        return (
            "where torchrun ran once per node, ftrun launch runs once for all of them: "
            "`ftrun launch --hosts a,b --nnodes 2 ... train.py`, or `ftrun sbatch --nodes 2`; "
            "see docs/torchrun.md"
        )
    if any(p.startswith("--nproc-per-node") for p in problems):
        return (
            "--nproc-per-node takes a number of ranks per host, or as torchrun: gpu (one per "
            "CUDA device), cpu (one per CPU) or auto (per accelerator device, else per CPU)"
        )
    if any(p.startswith(("--redirects", "--tee", "--local-ranks-filter")) for p in problems):
        return (
            "--redirects and --tee take 0 (none), 1 (stdout), 2 (stderr), 3 (both), or "
            "local_rank:value,... (0:3,1:0); --local-ranks-filter takes local ranks: 0,1"
        )
    if any("host" in p or "spares" in p or "min-nodes" in p for p in problems):
        return (
            "hosts are `host`, `user@host` or `user@host:port` (comma-separated, or one per "
            "line in a --hostfile); see `ftrun launch --help`"
        )
    if any("--profile" in p or "--device-memory" in p for p in problems):
        return "make a profile with `ftrun profile SCRIPT ARGS`; see docs/planner.md"
    if any("script" in p or "executable" in p for p in problems):
        return "check the path; use -m for a module or --no-python for an executable"
    return "see `ftrun launch --help`"
