"""The environment contract: every FTRUN_* variable that crosses a process boundary, in one table.

ftrun talks to processes it does not control the code of (torchrun, the user's ranks, the
checkpoint library inside them) through their environment. Each name is spelled once, here, with
who sets it and who reads it; code imports the constant, never the string. The one exception is
`ftrun/agent/rank_shim.py`, which runs as a plain file under torchrun and imports nothing of
ftrun: it keeps its own copy, and tests/unit/test_envcontract.py checks the copy against this
table.

Settings a user gives ftrun itself (FTRUN_RUN_DIR, FTRUN_DEBUG, the envvar of a CLI flag) are at
the end: they are read once, where configuration is resolved.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    name: str
    set_by: str
    read_by: str
    meaning: str


# -- between ftrun's own processes and the ranks ---------------------------------------------------
AGENT_ID = "FTRUN_AGENT_ID"
AGENT_SOCK = "FTRUN_AGENT_SOCK"
GENERATION = "FTRUN_GENERATION"
HOST = "FTRUN_HOST"
JOB_ID = "FTRUN_JOB_ID"
JOB_DIR = "FTRUN_JOB_DIR"
RANK_LOG_DIR = "FTRUN_RANK_LOG_DIR"
PREEMPT_FILE = "FTRUN_PREEMPT_FILE"
ZYGOTE_SOCK = "FTRUN_ZYGOTE_SOCK"
ZYGOTE_PRELOAD = "FTRUN_ZYGOTE_PRELOAD"
ENV_ROOM = "FTRUN_ENV_ROOM"
RESTART_COUNT = "FTRUN_TORCHELASTIC_RESTART_COUNT"
MAX_RESTARTS = "FTRUN_TORCHELASTIC_MAX_RESTARTS"
PLAN = "FTRUN_PLAN"
PROFILE_OUT = "FTRUN_PROFILE_OUT"
CHECKPOINT_KEY = "FTRUN_CHECKPOINT_KEY"
RESTORE_BEFORE = "FTRUN_RESTORE_BEFORE"

# -- a user's settings for ftrun itself -------------------------------------------------------------
RUN_DIR = "FTRUN_RUN_DIR"
DEBUG = "FTRUN_DEBUG"
SSH_CONFIG = "FTRUN_SSH_CONFIG"
EXIT_TIMEOUT = "FTRUN_EXIT_TIMEOUT"
IDLE_TIMEOUT = "FTRUN_IDLE_TIMEOUT"
QUARANTINE_FILE = "FTRUN_QUARANTINE_FILE"

CONTRACT: tuple[EnvVar, ...] = (
    EnvVar(
        AGENT_ID,
        "transport, agent",
        "agent sweeps (procs.py), tests",
        "job_id/agent_id on every process an agent starts: sweeps kill by it, never by pid",
    ),
    EnvVar(
        AGENT_SOCK,
        "agent",
        "rank shim, ftrun.runtime",
        "the agent's datagram socket: rank started/exited, steps, sections, code done",
    ),
    EnvVar(
        GENERATION,
        "agent",
        "rank shim, ftrun.runtime, ftrun.checkpoint",
        "the generation number; a message from an older one is dropped",
    ),
    EnvVar(HOST, "agent", "ranks (informational)", "the host name the controller knows"),
    EnvVar(JOB_ID, "agent", "ftrun.checkpoint", "names the memory tier's shared-memory files"),
    EnvVar(JOB_DIR, "controller", "ftrun.checkpoint", "the job directory: checkpoints/ under it"),
    EnvVar(RANK_LOG_DIR, "agent", "rank shim", "where each rank's output file goes"),
    EnvVar(
        PREEMPT_FILE,
        "agent",
        "ftrun.checkpoint",
        "exists once the job got a preemption notice: the next save() is persisted at once",
    ),
    EnvVar(ZYGOTE_SOCK, "agent", "rank shim", "the warm interpreter to fork ranks from"),
    EnvVar(
        ZYGOTE_PRELOAD,
        "launcher (LaunchConfig.zygote_preload)",
        "zygote",
        "modules the warm interpreter imports ahead of the first rank",
    ),
    EnvVar(
        ENV_ROOM,
        "agent (agent/proctitle.py, the zygote's start)",
        "nobody: its bytes are room",
        "blank room in the zygote's environment block, that a warm rank rewrites with its own "
        "environment so /proc/PID/environ shows it",
    ),
    EnvVar(
        RESTART_COUNT,
        "controller",
        "rank shim",
        "ftrun's restart count; replaces torchrun's TORCHELASTIC_RESTART_COUNT (always 0)",
    ),
    EnvVar(
        MAX_RESTARTS,
        "controller",
        "rank shim",
        "--max-restarts; replaces torchrun's TORCHELASTIC_MAX_RESTARTS",
    ),
    EnvVar(
        PLAN,
        "controller (a planned job: launch --profile)",
        "ftrun.parallel",
        "the generation's DP x PP plan as JSON (docs/planner.md): degrees, stages, micro-batches",
    ),
    EnvVar(
        PROFILE_OUT,
        "ftrun profile",
        "ftrun.parallel",
        "profile the script's layers in one process, write the profile JSON here, exit 0",
    ),
    EnvVar(
        CHECKPOINT_KEY,
        "agent (from the Bootstrap: the job's checkpoint.key, or the launcher's own value)",
        "ftrun.checkpoint",
        "hex HMAC key that every checkpoint pickle and manifest is authenticated with; a secret",
    ),
    EnvVar(
        RESTORE_BEFORE,
        "controller (a restore_rejected incident, docs/policy.md)",
        "ftrun.checkpoint",
        "restore no checkpoint of this step or later: the job failed twice right after it",
    ),
    EnvVar(RUN_DIR, "user", "config", "where job directories live"),
    EnvVar(DEBUG, "user", "cli", "=1: print tracebacks"),
    EnvVar(SSH_CONFIG, "user", "cli (--ssh-config)", "the ssh config file"),
    EnvVar(EXIT_TIMEOUT, "user", "cli (--exit-timeout)", "the exit barrier"),
    EnvVar(IDLE_TIMEOUT, "user", "cli (--idle-timeout)", "the idle allowance"),
    EnvVar(
        QUARANTINE_FILE,
        "user",
        "ftrun.quarantine",
        "the quarantine store [$XDG_STATE_HOME/ftrun/quarantine.json]",
    ),
)

# The names the rank shim keeps its own copy of (it cannot import ftrun).
RANK_SHIM_NAMES = (AGENT_SOCK, GENERATION, RANK_LOG_DIR, ZYGOTE_SOCK)

# Environment worth forwarding from the launcher to agents on other hosts (over ssh nothing is
# inherited), the way DeepSpeed's launcher forwards NCCL_*, UCX_*, ...; FTRUN_* carries ftrun's
# own settings. Not CUDA_* (CUDA_VISIBLE_DEVICES is per host) and not PYTHONHOME (per
# interpreter). The per-rank names (RANK, ...; userenv.py) are set by torchrun and never forwarded.
FORWARD_PREFIXES = ("NCCL_", "GLOO_", "TORCH_", "OMP_", "FTRUN_", "UCX_")
FORWARD_NAMES = ("PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONHASHSEED", "PYTHONFAULTHANDLER")


def forwarded(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of the launcher's environment that goes to every agent."""
    return {
        k: v for k, v in environ.items() if k.startswith(FORWARD_PREFIXES) or k in FORWARD_NAMES
    }
