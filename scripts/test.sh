#!/usr/bin/env bash
# Sets up .venv (scripts/setup.sh) and runs the whole test suite in it. CI runs exactly this
# (.ci/run). Arguments go to pytest: scripts/test.sh tests/unit -x
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
