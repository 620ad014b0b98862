#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the whole test suite. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PYTHON=${PYTHON:-python3}
exec "$PYTHON" -m pytest -q "$@"
