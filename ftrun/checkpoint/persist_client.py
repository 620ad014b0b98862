"""The rank's side of the persist worker: start it, send it work, track what it reports.

The worker is started with `python -m ftrun.checkpoint.worker` (no torch import, so milliseconds)
in the rank's own process group, so whatever kills the rank's group kills it too; it also dies
with its parent (PDEATHSIG) and on EOF of its command pipe.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ftrun

from ftrun.checkpoint.errors import CheckpointError
from ftrun.checkpoint.worker import encode_frame, read_frame


class PersistClient:
    def __init__(self, *, priority: str, on_message: Callable[[dict[str, Any]], None]) -> None:
        self._on_message = on_message
        self._lock = threading.Lock()
        read_fd, write_fd = os.pipe()
        # The worker must run this very ftrun, whatever the cwd or the installed one.
        root = str(Path(ftrun.__file__).resolve().parent.parent)
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ftrun.checkpoint.worker", "--reply-fd", str(write_fd),
                 "--parent", str(os.getpid()), "--priority", priority],
                stdin=subprocess.PIPE, pass_fds=(write_fd,), close_fds=True, env=env)
        finally:
            os.close(write_fd)
        self._replies = os.fdopen(read_fd, "rb", buffering=0)
        self._reader = threading.Thread(target=self._read, name="ftrun-ckpt-replies", daemon=True)
        self._reader.start()
        self.alive = True

    def _read(self) -> None:
        while (msg := read_frame(self._replies)) is not None:
            self._on_message(msg)
        self.alive = False
        self._on_message({"op": "exited", "code": self.proc.poll()})

    def send(self, msg: dict[str, Any]) -> None:
        data = encode_frame(msg)
        with self._lock:
            if self.proc.stdin is None:
                raise CheckpointError("the checkpoint persist worker is closed")
            try:
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError) as exc:
                raise CheckpointError(f"the checkpoint persist worker died (exit {self.proc.poll()})",
                                      hint="see the rank's log for its error") from exc

    def close(self, timeout_s: float) -> None:
        """Ask it to exit; after timeout_s, kill it. Idempotent."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            if self.proc.stdin is not None:
                try:
                    self.proc.stdin.write(encode_frame({"op": "exit"}))
                    self.proc.stdin.close()
                except (BrokenPipeError, OSError):
                    pass
                self.proc.stdin = None
        try:
            self.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._reader.join(max(0.1, deadline - time.monotonic()))
        self._replies.close()
