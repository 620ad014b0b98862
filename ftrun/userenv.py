"""The user's variables for the ranks: `--env NAME`, `--env NAME=VALUE` and `--env-file FILE`.

    # an env file: one NAME=VALUE per line, `#` starts a comment line, blank lines are skipped
    DATA_DIR=/mnt/shared/data
    export WANDB_PROJECT=llm       # `export ` is allowed, so a shell can source the same file
    WANDB_API_KEY="k-123"          # one pair of matching quotes around a value is removed
    HF_TOKEN                       # a name alone: its value in the launcher's environment

Files apply in order, then each --env; a later value wins. They reach the ranks on every host
inside the agents' bootstrap (stdin), never on a command line, so a key in a value is not shown
by `ps`; config.json keeps the names only. Names that torchrun or ftrun set for each rank are
refused: their value would be overwritten without a word. Pure: parsing only, every problem
reported at once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Set for each rank by torchrun (torch/distributed/run.py, local_elastic_agent.py) or by ftrun.
PER_RANK_NAMES = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_NAME",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    }
)
PER_RANK_PREFIXES = ("TORCHELASTIC_", "FTRUN_")


def user_env(
    env_files: Iterable[Path], env_args: Iterable[str], environ: Mapping[str, str]
) -> tuple[tuple[tuple[str, str], ...], list[str]]:
    """(NAME, VALUE) pairs in the order given (a later value wins), and every problem found."""
    values: dict[str, str] = {}
    problems: list[str] = []
    for path in env_files:
        _read_file(path, environ, values, problems)
    for arg in env_args:
        name, sep, value = arg.partition("=")
        _put(
            name, value if sep else None, f"--env {arg.split('=', 1)[0]}", environ, values, problems
        )
    return tuple(values.items()), problems


def _read_file(
    path: Path, environ: Mapping[str, str], values: dict[str, str], problems: list[str]
) -> None:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        problems.append(f"--env-file {str(path)!r} cannot be read: {reason}")
        return
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export ") or line.startswith("export\t"):
            line = line[len("export") :].lstrip()
        name, sep, value = line.partition("=")
        if sep:
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
        # The line number, never the line: it may hold a secret.
        _put(
            name.strip(),
            value if sep else None,
            f"--env-file {path}, line {number}",
            environ,
            values,
            problems,
        )


def _put(
    name: str,
    value: str | None,
    where: str,
    environ: Mapping[str, str],
    values: dict[str, str],
    problems: list[str],
) -> None:
    if not _NAME.fullmatch(name):
        problems.append(
            f"{where}: not NAME=VALUE or NAME (a name is letters, digits and _, "
            f"not starting with a digit)"
        )
    elif name in PER_RANK_NAMES or name.startswith(PER_RANK_PREFIXES):
        problems.append(
            f"{where}: {name} is set for each rank by torchrun or ftrun; it cannot be forwarded"
        )
    elif value is None and name not in environ:
        problems.append(f"{where}: {name} is not set here, so there is no value to forward")
    elif value is not None and "\0" in value:  # no environment can hold it: execve refuses
        problems.append(f"{where}: the value of {name} holds a NUL byte, which no environment can")
    else:
        values[name] = environ[name] if value is None else value
