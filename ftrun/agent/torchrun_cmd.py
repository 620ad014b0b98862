"""Building the command that runs one generation's torchrun on this host, and its environment.

    python -u rank_shim.py torchrun --nnodes N --node-rank R ... rank_shim.py rank ENTRYPOINT...

rank_shim.py stands in front of torchrun (to fork it from the warm interpreter) and is torchrun's
entrypoint for each rank (to report how the rank started and exited, and to point its output at
its log file). torchrun itself never restarts (--max-restarts 0): ftrun restarts job-wide.

The environment is the contract with the shim and the ranks: the FTRUN_* names below say which
job, generation and host they belong to, where the agent's datagram socket is (rank_socket.py),
where the rank logs go, the warm interpreter's socket when there is one, and the job's checkpoint
key (a secret: in the environment, which only this user can read, never in argv). Pure: the caller
passes everything in, so what the agent would run can be read without running it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftrun import envcontract
from ftrun.bootstrap import Bootstrap

SHIM = str(Path(__file__).with_name("rank_shim.py"))


@dataclass(frozen=True, kw_only=True)
class TorchrunCommand:
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str | None


# In the generation's work dir: the agent creates it on a preemption notice (agent.py), and
# ftrun.checkpoint persists its next save when it sees it. Per generation, so it never outlives
# the notice it stands for.
PREEMPT_FLAG = "preempt"


def torchrun_command(
    boot: Bootstrap,
    launch: Mapping[str, Any],
    *,
    directory: Path,
    agent_sock: str,
    zygote_sock: str | None,
    base_env: Mapping[str, str],
) -> TorchrunCommand:
    """The command for the controller's `launch` message. `directory` is the generation's work
    dir, `base_env` the agent's own environment (the forwarded one, os.environ); the launch's
    env and the FTRUN_* contract come on top. Raises KeyError for a launch that lacks a field."""
    number = int(launch["gen"])
    env = {
        **base_env,
        **launch.get("env", {}),
        envcontract.JOB_ID: boot.job_id,
        envcontract.GENERATION: str(number),
        envcontract.HOST: boot.host,
        envcontract.AGENT_ID: boot.process_tag,
        envcontract.AGENT_SOCK: agent_sock,
        envcontract.RANK_LOG_DIR: str(directory),
        envcontract.PREEMPT_FILE: str(directory / PREEMPT_FLAG),
    }
    if zygote_sock is not None:
        env[envcontract.ZYGOTE_SOCK] = zygote_sock
    if boot.checkpoint_key:  # ftrun.checkpoint's HMAC key: the job's, from the bootstrap
        env[envcontract.CHECKPOINT_KEY] = boot.checkpoint_key
    argv = (
        boot.python,
        "-u",
        SHIM,
        "torchrun",
        "--nnodes",
        str(launch["nnodes"]),
        "--node-rank",
        str(launch["node_rank"]),
        "--nproc-per-node",
        str(launch["nproc_per_node"]),
        "--master-addr",
        launch["master_addr"],
        "--master-port",
        str(launch["master_port"]),
        "--max-restarts",
        "0",
        "--monitor-interval",
        "0.1",
        # TORCHELASTIC_RUN_ID, as torchrun defines it: one id for the whole job.
        "--rdzv-id",
        boot.job_id,
        # torchrun's own files (error files, a mkdtemp per run) go with the agent's
        # work dir, not into /tmp for good.
        "--log-dir",
        str(directory / "torchrun"),
        SHIM,
        "rank",
        *launch["entrypoint"],
    )
    return TorchrunCommand(argv=argv, env=env, cwd=launch.get("cwd"))
