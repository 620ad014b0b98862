#!/usr/bin/env bash
# Sets up .venv (scripts/setup.sh; quick when nothing changed), runs the static checks (ruff lint
# and format check, mypy on ftrun/), then the tests in it. CI runs exactly this (.ci/run).
#
#   scripts/test.sh                  static checks + every tier (CI)
#   scripts/test.sh --fast           static checks + the pure tier: no process spawned, seconds
#   scripts/test.sh --no-static ...  skip the static checks (while iterating on a test)
#   scripts/test.sh tests/unit -x    anything else goes to pytest
#   FTRUN_TEST_WORKERS=0 scripts/test.sh   the suite in one process, one test at a time
#
# Tiers (markers set in tests/conftest.py): unmarked = pure and in-process; `ranks` = real agents,
# torchrun and torch ranks; `testbed` = also the ssh hosts in network namespaces (root).
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0 static=1 args=()
for arg in "$@"; do
    case "$arg" in
        --fast) fast=1 ;;
        --no-static) static=0 ;;
        *) args+=("$arg") ;;
    esac
done
bash scripts/setup.sh
if [ "$static" = 1 ]; then
    echo "test.sh: ruff check, ruff format --check, mypy ftrun" >&2
    .venv/bin/ruff check --quiet ftrun tests scripts
    .venv/bin/ruff format --quiet --check ftrun tests scripts
    .venv/bin/mypy ftrun
fi
# Bytecode for this clone's own modules, as `pip install` writes it for an installed package: a
# run starts hundreds of Python processes that import ftrun (controllers, agents, zygotes, ranks,
# CLI calls), and where PYTHONDONTWRITEBYTECODE is set (this machine sets it) none of them writes
# a .pyc, so each would compile ftrun from source again (~0.2 s of CPU a local job, measured).
# compileall skips what is current; Python still recompiles a file edited since.
.venv/bin/python -m compileall -q ftrun tests scripts recipes >/dev/null
if [ "$fast" = 1 ]; then
    exec .venv/bin/python -m pytest -q -m "not ranks and not testbed" "${args[@]}"
fi
# On $FTRUN_TEST_WORKERS workers (default 2; 0: in this process). Mostly CPU (torch imports and
# the ranks' steps, counting the testbed hosts' processes, which `time` does not see), not all:
# vmstat over a clean-clone run, 23 % idle, in tests that wait for a fault's detection or a
# trace's schedule. Each worker has its own testbeds, shared by its testbed tests (tests/conftest.py).
# --durations: the slowest tests, in every CI log: where the suite's 15 minutes go.
exec .venv/bin/python -m pytest -q --durations=25 -n "${FTRUN_TEST_WORKERS:-2}" "${args[@]}"
