"""What an agent tells the controller of its host in its hello, for the checks before a job's
first step (controller/host_checks.py): the Python and torch the ranks will run (read from the
installed package's metadata: the agent never imports torch), and its wall clock."""

from __future__ import annotations

import importlib.metadata
import platform
import time
from typing import Any


def facts() -> dict[str, Any]:
    try:
        torch: str | None = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = None
    return {"python": platform.python_version(), "torch": torch, "wall_t": time.time()}
