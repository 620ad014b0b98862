"""The rank's side of the persist worker: start it, tell it what to persist, relay its replies.

The worker is started with `python -m ftrun.checkpoint.worker` (no torch import, so milliseconds)
in the rank's own process group, so whatever kills the rank's group kills it too; it also dies
with its parent (PDEATHSIG) and on EOF of its command pipe.

This module owns the rank's half of the worker protocol (see `worker_protocol.py`): `persist_message`
turns a snapshot in a slot and its storage plan into the "persist" command, with the file names
and directories of `storage.py`, so the Manager deals in snapshots and never in frames. Importing
it does not import torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ftrun
from ftrun.checkpoint import storage
from ftrun.checkpoint.errors import CheckpointError
from ftrun.checkpoint.worker_protocol import encode_frame, read_frame

if TYPE_CHECKING:
    from ftrun.checkpoint.config import CheckpointConfig
    from ftrun.checkpoint.dcp_layout import StoragePlan
    from ftrun.checkpoint.slot_layout import TensorEntry


def persist_message(
    *,
    step: int,
    rank: int,
    world_size: int,
    slot_path: str,
    entries: Sequence[TensorEntry],
    objects: bytes,
    plan: StoragePlan,
    config: CheckpointConfig,
    nonce: str,
) -> dict[str, Any]:
    """The "persist" command for the snapshot of `step` in the slot at `slot_path`.

    The worker copies this rank's share of the tensors (`plan.items`, located in the slot through
    `entries`) into its data file under a temporary directory unique to this generation and
    manager (`nonce`); rank 0's command also carries what the commit needs.
    """
    by_key = {e.key: e for e in entries}
    items = [(by_key[key].offset, nbytes, file_off) for key, file_off, nbytes in plan.items]
    directory = config.directory
    commit = None
    if rank == 0:
        commit = {
            "world_size": world_size,
            "metadata": plan.metadata,
            "final_dir": str(directory / storage.step_dir_name(step)),
            "keep": config.keep,
            "timeout": config.persist_timeout,
            "job_id": config.job_id,
            "owner": config.owner,  # fences on iff set (fence.py)
        }
    return {
        "op": "persist",
        "step": step,
        "generation": config.generation,
        "rank": rank,
        "slot_path": slot_path,
        "tmp_dir": str(directory / storage.tmp_dir_name(step, config.generation, nonce)),
        "files": [{"name": storage.data_file_name(rank), "items": items}],
        "objects": objects,
        "commit": commit,
        "bandwidth": config.persist_bandwidth * 1e6,
        # for the worker's manifests (a private pipe: see worker.py)
        "key": config.hmac_key,
    }


class PersistClient:
    """One persist worker for this rank; `on_message` gets its replies on a reader thread."""

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
                [
                    sys.executable,
                    "-m",
                    "ftrun.checkpoint.worker",
                    "--reply-fd",
                    str(write_fd),
                    "--parent",
                    str(os.getpid()),
                    "--priority",
                    priority,
                ],
                stdin=subprocess.PIPE,
                pass_fds=(write_fd,),
                close_fds=True,
                env=env,
            )
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
                raise CheckpointError(
                    f"the checkpoint persist worker died (exit {self.proc.poll()})",
                    hint="see the rank's log for its error",
                ) from exc

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
