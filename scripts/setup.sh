#!/usr/bin/env bash
# Installs ftrun and what it needs on a fresh machine. Idempotent; safe to run again.
# torch is pinned to the CPU build 2.13.0: a looser requirement pulls several GB of CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null; then
    "$PYTHON" -m pip install --quiet torch==2.13.0
fi
"$PYTHON" -m pip install --quiet -e '.[test]'
