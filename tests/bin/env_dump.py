"""Prints the environment variables a rank sees, as one JSON line."""

import json
import os

keys = [
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "FTRUN_JOB_ID",
    "FTRUN_GENERATION",
    "FTRUN_JOB_DIR",
    "TORCHELASTIC_RUN_ID",
]
print("ENV " + json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
