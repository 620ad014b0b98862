"""A rank's torchelastic error file: what torch's `@record` writes when the rank dies of an
exception (torch/distributed/elastic/multiprocessing/errors/error_handler.py). torchrun points
each rank's TORCHELASTIC_ERROR_FILE at `<log dir>/<run id>_*/attempt_N/<local rank>/error.json`;
when a rank fails and the file is there, its exception and traceback are the root cause, exact
even when the rank's output was noisy, redirected or cut short.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MAX_BYTES = 1 << 18  # larger is not an error file we can pass on in one message
MAX_MESSAGE_CHARS = 2000
MAX_TRACEBACK_CHARS = 64_000


def find(torchrun_log_dir: Path, local_rank: int) -> Path | None:
    """The rank's error file, if it wrote one (one attempt per generation under ftrun)."""
    found = sorted(torchrun_log_dir.glob(f"*/attempt_*/{local_rank}/error.json"))
    return found[-1] if found else None


def read(path: Path) -> dict[str, Any] | None:
    """{"exception", "message", "traceback", "timestamp"}, or None if the file is unreadable or
    not an error file. "exception" is the message's first line, as in "ValueError: boom"."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
        doc = json.loads(data) if len(data) <= MAX_BYTES else None
    except (OSError, ValueError):
        return None
    message = doc.get("message") if isinstance(doc, dict) else None
    if isinstance(message, str):  # the format's other shape: a bare message
        text, stack, when = message, None, None
    elif isinstance(message, dict) and isinstance(message.get("message"), str):
        extra = message.get("extraInfo")
        extra = extra if isinstance(extra, dict) else {}
        text, stack, when = message["message"], extra.get("py_callstack"), extra.get("timestamp")
    else:
        return None
    lines = text.strip().splitlines()
    return {
        "exception": lines[0][:MAX_MESSAGE_CHARS] if lines else None,
        "message": text[:MAX_MESSAGE_CHARS],
        "traceback": stack.rstrip()[-MAX_TRACEBACK_CHARS:] if isinstance(stack, str) else None,
        "timestamp": when,
    }
