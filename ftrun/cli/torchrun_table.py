"""The table of torchrun's flags that `ftrun launch` takes beside its own.

For each flag of torchrun's parser (torch/distributed/run.py) that ftrun has no flag of its own
for: its spellings, what typer converts its value to, and either None (it is mapped onto ftrun's
settings: torchrun_flags.py's TorchrunFlags does that) or the one line that says what ftrun does
instead. The table apart from the mapping so that tests/unit/test_torchrun_flags.py and
docs/torchrun.md check it against torchrun's own parser, flag by flag.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

RENDEZVOUS = (
    "not needed: ftrun starts every host itself and picks each generation's rendezvous "
    "(MASTER_ADDR: its first host, a free port unless --master-port)"
)
LOGS = "not needed: every rank's output is in <job dir>/logs/g<generation>/rank<N>.log"


@dataclasses.dataclass(frozen=True)
class Flag:
    """One of torchrun's flags: its spellings (the first is the one ftrun's messages use)."""

    names: tuple[str, ...]
    kind: type  # what typer converts the value to
    instead: str | None = None  # why ftrun does not need it; None: mapped onto ftrun's settings
    metavar: str | None = None
    minimum: float | None = None  # a number below it is refused as typer refuses one

    @property
    def flag(self) -> str:
        return self.names[0]


# torchrun's flags that `ftrun launch` does not have as its own, by parameter name.
FLAGS: dict[str, Flag] = {
    "nnodes": Flag(("--nnodes",), str, metavar="N|MIN:MAX"),
    "standalone": Flag(("--standalone",), bool),
    "node_rank": Flag(("--node-rank", "--node_rank"), int, metavar="N", minimum=0),
    "rdzv_backend": Flag(("--rdzv-backend", "--rdzv_backend"), str, RENDEZVOUS, metavar="BACKEND"),
    "rdzv_endpoint": Flag(
        ("--rdzv-endpoint", "--rdzv_endpoint"), str, RENDEZVOUS, metavar="HOST:PORT"
    ),
    "rdzv_id": Flag(
        ("--rdzv-id", "--rdzv_id"),
        str,
        "not needed: TORCHELASTIC_RUN_ID is the job's id (--job-id)",
        metavar="ID",
    ),
    "rdzv_conf": Flag(("--rdzv-conf", "--rdzv_conf"), str, RENDEZVOUS, metavar="K=V,..."),
    "master_addr": Flag(("--master-addr", "--master_addr"), str, RENDEZVOUS, metavar="ADDR"),
    "local_addr": Flag(
        ("--local-addr", "--local_addr"),
        str,
        "not needed: ftrun finds each host's address (--controller-addr is this machine's)",
        metavar="ADDR",
    ),
    "monitor_interval": Flag(
        ("--monitor-interval", "--monitor_interval"),
        float,
        "not needed: ftrun's agents watch their ranks all the time and report every "
        "--heartbeat-interval",
        metavar="SECONDS",
        minimum=0,
    ),
    "start_method": Flag(
        ("--start-method", "--start_method"),
        str,
        "not needed: it only matters to torchrun for a function; a script's ranks are "
        "processes either way (--warm-start forks them from a pre-imported interpreter)",
        metavar="METHOD",
    ),
    "event_log_handler": Flag(
        ("--event-log-handler", "--event_log_handler"),
        str,
        "not needed: ftrun records every event in <job dir>/events.jsonl (`ftrun inspect`)",
        metavar="NAME",
    ),
    "role": Flag(
        ("--role",), str, "not used: ftrun runs one role, ROLE_NAME stays `default`", "NAME"
    ),
    "run_path": Flag(("--run-path", "--run_path"), bool),
    "log_dir": Flag(("--log-dir", "--log_dir"), Path, metavar="DIR"),
    "redirects": Flag(("-r", "--redirects"), str, metavar="STD"),
    "tee": Flag(("-t", "--tee"), str, metavar="STD"),
    "local_ranks_filter": Flag(
        ("--local-ranks-filter", "--local_ranks_filter"), str, metavar="RANKS"
    ),
    "duplicate_stdout_filters": Flag(
        ("--duplicate-stdout-filters", "--duplicate_stdout_filters"), str, LOGS, metavar="FILTERS"
    ),
    "duplicate_stderr_filters": Flag(
        ("--duplicate-stderr-filters", "--duplicate_stderr_filters"), str, LOGS, metavar="FILTERS"
    ),
    "logs_specs": Flag(("--logs-specs", "--logs_specs"), str, LOGS, metavar="NAME"),
    "numa_binding": Flag(
        ("--numa-binding", "--numa_binding"),
        str,
        "not applied: bind in the script, or run numactl with --no-python",
        metavar="MODE",
    ),
    "signals_to_handle": Flag(
        ("--signals-to-handle", "--signals_to_handle"),
        str,
        "not needed: SIGTERM and SIGINT stop the job as under torchrun; --forward-signal "
        "passes others on to the ranks",
        metavar="SIGS",
    ),
    "shutdown_timeout": Flag(
        ("--shutdown-timeout", "--shutdown_timeout"), float, metavar="SECONDS", minimum=0
    ),
    "virtual_local_rank": Flag(
        ("--virtual-local-rank", "--virtual_local_rank"),
        bool,
        "not applied: LOCAL_RANK is the rank's index on its host",
    ),
}
# `ftrun launch --help` for the flags ftrun maps; the others share one line (torchrun_flags.py).
HELP = {
    "nnodes": "torchrun's N or MIN:MAX: the hosts' count (--min-nodes/--max-nodes) [1].",
    "standalone": "torchrun's: ftrun's rendezvous is its own already.",
    "node_rank": "torchrun's: ftrun numbers the hosts itself: only 0.",
    "run_path": "torchrun's: run SCRIPT with python (ftrun's default).",
    "log_dir": "torchrun's: DIR/<job id> points at the job's rank logs.",
    "redirects": "torchrun's: local ranks with 3 (both streams) are not shown on the console.",
    "tee": "torchrun's: ftrun shows and logs every rank already.",
    "local_ranks_filter": "torchrun's: only these local ranks (0,1) are shown on the console.",
    "shutdown_timeout": "torchrun's name of --term-timeout.",
}
