"""The persist worker: one small process per rank that writes snapshots from memory to storage.

It is pure Python (no torch import, starts in milliseconds), runs at low CPU priority
(nice 10 by default; SCHED_IDLE on request) so it mostly uses cycles the training loop leaves free, and has its own GIL,
so writing and checksumming gigabytes never holds up the rank's Python thread. It dies with its
rank (PR_SET_PDEATHSIG, and EOF on its command pipe).

Its protocol with the rank is `worker_protocol.py`; its writes, O_DIRECT, checksummed and paced,
are `direct_write.py`. What it does with a "persist" command is here: write this rank's files
of the checkpoint into the step's temporary directory, say "released" as soon as the slot is
read, sync, write this rank's part file; and on rank 0, wait for every rank's part, write the
DCP `.metadata` and the manifest, and rename the directory into place under the storage
directory's generation fence (fence.py), then prune.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import select
import shutil
import signal
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, BinaryIO

from ftrun.checkpoint import storage
from ftrun.checkpoint.direct_write import Throttle, write_file
from ftrun.checkpoint.fence import FENCE_TIMEOUT_S, GenerationFence, Superseded
from ftrun.checkpoint.worker_protocol import encode_frame, read_frame

PART_POLL_S = 0.01
MADV_POPULATE_READ = 22  # Linux >= 5.14; not exported by Python's mmap module


class Aborted(Exception):
    """The rank went away (or asked us to exit) while we waited."""


class Worker:
    def __init__(self, commands: BinaryIO, reply_fd: int) -> None:
        self.commands = commands
        self.reply_fd = reply_fd
        self.pending: list[dict[str, Any]] = []
        self.maps: dict[str, mmap.mmap] = {}  # slot path -> mapping, kept across persists

    def slot_map(self, path: str) -> mmap.mmap:
        """Map a slot once and fault it in once (a slot that grew is mapped again). The path is
        this rank's own: a file in its 0700 tier directory (slots.py checked it and opened it
        O_NOFOLLOW), or /proc/<rank>/fd/<n> of a memfd, a link by nature."""
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            mm = self.maps.get(path)
            if mm is None or len(mm) != size:
                if mm is not None:
                    mm.close()
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                try:
                    mm.madvise(MADV_POPULATE_READ)
                except OSError:
                    pass
                self.maps[path] = mm
        return mm

    def reply(self, **msg: Any) -> None:
        data = encode_frame(msg)
        while data:
            data = data[os.write(self.reply_fd, data) :]

    def run(self) -> None:
        self.reply(op="ready", pid=os.getpid())
        while True:
            msg = self.pending.pop(0) if self.pending else read_frame(self.commands)
            if msg is None or msg["op"] == "exit":
                return
            if msg["op"] == "persist":
                try:
                    path = self.persist(msg)
                    self.reply(op="done", step=msg["step"], ok=True, error="", path=path)
                except Aborted:
                    return
                except Superseded as exc:
                    self.reply(
                        op="done",
                        step=msg["step"],
                        ok=False,
                        error=str(exc),
                        path="",
                        superseded=True,
                    )
                except Exception as exc:  # noqa: BLE001 - reported to the rank, which warns
                    error = f"{type(exc).__name__}: {exc}"
                    self._fail_part(msg, error)
                    self.reply(op="done", step=msg["step"], ok=False, error=error, path="")

    @staticmethod
    def _fail_part(msg: dict[str, Any], error: str) -> None:
        """Tell rank 0's commit not to wait for this rank's part (best effort)."""
        try:
            storage.write_json_atomic(
                Path(msg["tmp_dir"]) / storage.part_file_name(msg["rank"]),
                {"rank": msg["rank"], "step": msg["step"], "error": error},
                key=msg["key"],
            )
        except OSError:
            pass

    # -- one persist ---------------------------------------------------------------------------

    def persist(self, msg: dict[str, Any]) -> str:
        tmp = Path(msg["tmp_dir"])
        storage.private_subdir(tmp)  # every rank's worker makes it, or finds it made by a peer
        rank = msg["rank"]
        files: dict[str, dict[str, int]] = {}
        fds: list[int] = []
        try:
            mm = self.slot_map(msg["slot_path"])
            throttle = Throttle(msg.get("bandwidth", 0))
            for spec in msg["files"]:
                fd, files[spec["name"]] = write_file(
                    tmp / spec["name"], mm, spec["items"], throttle
                )
                fds.append(fd)
            self.reply(op="released", step=msg["step"])
            name = storage.objects_file_name(rank)
            crc = storage.write_file(tmp / name, msg["objects"])
            files[name] = {"size": len(msg["objects"]), "crc32": crc}
            for fd in fds:
                os.fsync(fd)
        finally:
            for fd in fds:
                os.close(fd)
        storage.write_json_atomic(
            tmp / storage.part_file_name(rank),
            {"rank": rank, "step": msg["step"], "files": files},
            key=msg["key"],
        )
        if msg.get("commit") is None:
            return ""
        return self.commit(msg, tmp)

    def commit(self, msg: dict[str, Any], tmp: Path) -> str:
        """Rank 0: wait for every rank's part, write .metadata + manifest, rename into place."""
        commit = msg["commit"]
        world = commit["world_size"]
        deadline = time.monotonic() + commit["timeout"]
        parts: dict[int, dict[str, Any]] = {}
        while len(parts) < world:
            for r in range(world):
                if r not in parts:
                    try:
                        parts[r] = storage.read_json_checked(
                            tmp / storage.part_file_name(r), key=msg["key"]
                        )
                    except storage.Invalid:
                        pass
            if len(parts) < world:
                if time.monotonic() > deadline:
                    missing = sorted(set(range(world)) - set(parts))
                    raise TimeoutError(
                        f"ranks {missing} did not finish their part of step "
                        f"{msg['step']} within {commit['timeout']} s"
                    )
                self._idle_wait(PART_POLL_S)
        files: dict[str, dict[str, int]] = {}
        for part in parts.values():
            if part.get("error"):
                raise RuntimeError(f"rank {part['rank']} could not write its part: {part['error']}")
            if part["step"] != msg["step"]:
                raise RuntimeError(f"rank {part['rank']} wrote a part for step {part['step']}")
            files.update(part["files"])
        crc = storage.write_file(tmp / storage.METADATA, commit["metadata"])
        files[storage.METADATA] = {"size": len(commit["metadata"]), "crc32": crc}
        storage.write_json_atomic(
            tmp / storage.MANIFEST,
            {
                "format": storage.FORMAT,
                "step": msg["step"],
                "generation": msg["generation"],
                "world_size": world,
                "job_id": commit.get("job_id"),
                "created_unix": time.time(),
                "files": files,
            },
            key=msg["key"],
        )
        final = Path(commit["final_dir"])
        fence = None
        if commit.get("owner"):  # under ftrun (config.py)
            fence = GenerationFence(
                final.parent,
                job=commit["owner"],
                generation=msg["generation"],
                timeout_s=FENCE_TIMEOUT_S,
            )
        try:
            # A newer generation may have claimed the directory (this rank's host was lost and
            # replaced while it trained on): then nothing of ours is published or pruned.
            with fence.hold() if fence else nullcontext():
                storage.commit_dir(tmp, final)
                storage.prune(final.parent, commit["keep"], key=msg["key"])
        except Superseded:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            if fence:
                fence.close()
        return str(final)

    def _idle_wait(self, timeout_s: float) -> None:
        """Wait up to timeout_s, watching the command pipe: EOF or exit aborts, others queue."""
        ready, _, _ = select.select([self.commands], [], [], timeout_s)
        if ready:
            msg = read_frame(self.commands)
            if msg is None or msg["op"] == "exit":
                raise Aborted
            self.pending.append(msg)


def _lower_priority(mode: str) -> None:
    """low: nice 10 (~10% of a core when the training threads saturate it, all idle time
    otherwise); idle: SCHED_IDLE (only idle time: it may starve on a saturated CPU)."""
    try:
        if mode in ("low", "idle"):
            os.nice(10 if mode == "low" else 19)
        if mode == "idle":
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError):
        pass


def _die_with_parent(parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="ftrun checkpoint persist worker (started by a rank)")
    p.add_argument("--reply-fd", type=int, required=True)
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--priority", choices=["low", "idle", "normal"], default="low")
    args = p.parse_args(argv)
    _die_with_parent(args.parent)
    _lower_priority(args.priority)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the rank decides when we stop
    # Unbuffered, so select() on it sees exactly what is left to read.
    Worker(os.fdopen(0, "rb", buffering=0), args.reply_fd).run()


if __name__ == "__main__":
    main()
