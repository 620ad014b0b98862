"""The warm interpreter: imports torch once, then forks a ready process for each start request.

A restart's cost is mostly start-up: a fresh interpreter importing torch takes seconds on a small
machine, and torchrun itself is such an interpreter. The agent starts one zygote per host; each
generation's torchrun and ranks are forks of it (rank_shim.py asks, passing its stdin/stdout/
stderr over SCM_RIGHTS), so a restart pays milliseconds instead of seconds. The technique is
Android's zygote (one process preloads the runtime; every app starts as a fork of it); for
training jobs, TrainMover's warm-up sandbox is the precedent for readying a worker before it is
needed.

A fork does not run the user's code inside the zygote's loop: it returns out of `serve()` to
`main()` and becomes the process `python -u script.py` would have been (as_main.py), so the
interpreter finalizes it as it finalizes any script. A request whose interpreter-level
environment (PYTHON*, LD_*) differs from the zygote's is refused: the shim starts that one cold.

Fork-safety: the zygote starts no threads and runs no torch operation before forking, so the
child inherits no held locks and no thread pool; CUDA is never initialised here. (Importing torch
starts one thread, NumPy's OpenBLAS server, which stops and restarts itself around fork() through
its pthread_atfork handlers.)

Lifetime: the zygote dies when the agent does (EOF on stdin), and every fork dies with the zygote
(PR_SET_PDEATHSIG) or when the shim that asked for it goes away (EOF on its connection).
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import traceback
from collections.abc import Mapping
from typing import Any

from ftrun import envcontract
from ftrun.agent import as_main, proctitle

PR_SET_PDEATHSIG = 1
MAX_MESSAGE = 1 << 20
# torch._dynamo is what DistributedDataParallel imports on first use (~1 s here, 800 modules).
# Imported ahead of the script's init_process_group() it makes torch 2.13's gloo exit deadlock
# likely (5 of 10 warm ddp_destroy.py runs; docs/architecture.md, "A torch race"); a warm rank's
# destroy_process_group() waits for parked gloo workers (gloo_quiesce.py), which took that to 0
# of 30 with it preloaded, on a loaded machine, so the restart keeps its second.
DEFAULT_PRELOAD = "torch,torch.distributed,torch.nn.parallel,torch.distributed.run,torch._dynamo"
# Variables a fresh interpreter reads before its first line (sys.path, flags, hashing, the
# dynamic loader, glibc's tunables and malloc settings): a fork of a zygote started with other
# values could not honour them.
INTERPRETER_ENV_PREFIXES = ("PYTHON", "LD_", "GLIBC_TUNABLES", "MALLOC_")


class Zygote:
    def __init__(self, path: str) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        if os.path.exists(path):  # left by a zygote that died; ours is the only one now
            os.unlink(path)
        self.listener.bind(path)
        self.listener.listen(64)
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, tuple[socket.socket, int]] = {}  # pid -> (conn, pidfd)
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.pid = os.getpid()

    def preload(self, modules: str) -> None:
        """Import each module in turn; one that cannot be imported is named and skipped (the
        warm start goes on without it: the script imports it when it needs it)."""
        for name in filter(None, (m.strip() for m in modules.split(","))):
            try:
                importlib.import_module(name)
            except ImportError as e:
                print(f"ftrun: warm start: cannot preload {name}: {e}", file=sys.stderr)

    def serve(self) -> dict[str, Any]:
        """Serve start requests until the agent goes. Returns only in a forked child: the
        request that child is to become."""
        self.selector.register(self.listener, selectors.EVENT_READ, ("accept", None))
        self.selector.register(sys.stdin, selectors.EVENT_READ, ("agent", None))
        signal.signal(signal.SIGTERM, lambda *_: self.shutdown())
        while True:
            for key, _ in self.selector.select():
                what, pid = key.data
                try:
                    if what == "accept":
                        request = self._accept()
                        if request is not None:
                            return request
                    elif what == "agent":
                        if not os.read(sys.stdin.fileno(), 4096):
                            self.shutdown()
                    elif what == "exited":
                        self._reap(pid)
                    elif what == "conn":
                        self._on_conn(pid)
                except Exception:
                    if os.getpid() != self.pid:
                        raise  # a child that failed to become its process: it must not serve
                    traceback.print_exc()

    def _accept(self) -> dict[str, Any] | None:
        """Fork a child for one request: in the child, returns the request; here, None."""
        conn, _ = self.listener.accept()
        try:
            data, fds, _flags, _addr = socket.recv_fds(conn, MAX_MESSAGE, 3)
            request = json.loads(data)
        except (OSError, ValueError):
            conn.close()
            return None
        if _peer_gone(conn):  # the shim stopped waiting (its reply timeout) and started cold
            for fd in fds:
                os.close(fd)
            conn.close()
            return None
        mismatch = interpreter_env_mismatch(request.get("env", {}), os.environ)
        if mismatch:
            _send(conn, {"cold": f"{mismatch} differs from the warm interpreter's"})
            for fd in fds:
                os.close(fd)
            conn.close()
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self._leave(fds, conn)
            return request
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.children[pid] = (conn, pidfd)
        self.selector.register(pidfd, selectors.EVENT_READ, ("exited", pid))
        self.selector.register(conn, selectors.EVENT_READ, ("conn", pid))
        _send(conn, {"pid": pid})
        return None

    def _reap(self, pid: int) -> None:
        conn, pidfd = self.children.pop(pid)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        _send(
            conn,
            {"signal": -code, "exit_code": None}
            if code < 0
            else {"signal": None, "exit_code": code},
        )
        self._forget(pidfd)
        self._forget(conn)
        os.close(pidfd)
        conn.close()

    def _forget(self, fileobj: socket.socket | int) -> None:
        try:
            self.selector.unregister(fileobj)
        except (KeyError, ValueError):
            pass

    def _on_conn(self, pid: int) -> None:
        if pid not in self.children:  # reaped just before, in the same select() batch (a child
            return  # that exits closes its end too: both events come at once)
        conn, _ = self.children[pid]
        try:
            data = conn.recv(MAX_MESSAGE)
        except OSError:
            data = b""
        if not data:  # the shim died: its child must not outlive it
            _killpg(pid, signal.SIGKILL)
            self._forget(conn)

    def shutdown(self) -> None:
        for pid in list(self.children):
            _killpg(pid, signal.SIGKILL)
        os._exit(0)

    def _leave(self, fds: list[int], conn: socket.socket) -> None:
        """In the forked child: leave the zygote behind (its session, sockets, children) and
        take the shim's stdin/stdout/stderr. as_main.prepare() does the rest."""
        os.setsid()
        self.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        for other_conn, pidfd in self.children.values():
            other_conn.close()
            os.close(pidfd)
        self.children.clear()
        conn.close()
        self.selector.close()
        self.listener.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)


def interpreter_env_mismatch(requested: Mapping[str, str], ours: Mapping[str, str]) -> str | None:
    """The first variable read at interpreter start-up whose value differs, or None."""
    names = {n for n in (*requested, *ours) if n.startswith(INTERPRETER_ENV_PREFIXES)}
    for name in sorted(names):
        if requested.get(name) != ours.get(name):
            return name
    return None


def _peer_gone(conn: socket.socket) -> bool:
    """Whether the other end has closed (EOF after its request), without waiting."""
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _send(conn: socket.socket, body: dict[str, Any]) -> None:
    try:
        conn.send(json.dumps(body).encode())
    except OSError:
        pass


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except OSError:
        pass


def main() -> None:
    path = sys.argv[1]
    proctitle.set_title(f"ftrun-zygote {path}")
    zygote = Zygote(path)  # listen first: shims that connect while we import just wait
    zygote.preload(os.environ.get(envcontract.ZYGOTE_PRELOAD, DEFAULT_PRELOAD))
    request = zygote.serve()
    # Only a forked child gets here. It becomes the requested process; when that code returns
    # or raises, this interpreter finalizes it as it would after `python -u script.py`.
    del zygote
    as_main.prepare(request)
    as_main.run(request)


if __name__ == "__main__":
    main()
