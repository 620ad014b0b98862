"""The warm interpreter: imports torch once, then forks a ready process for each start request.

A restart's cost is mostly start-up: a fresh interpreter importing torch takes seconds on a small
machine, and torchrun itself is such an interpreter. The agent starts one zygote per host; each
generation's torchrun and ranks are forks of it (rank_shim.py asks, passing its stdin/stdout/
stderr over SCM_RIGHTS), so a restart pays milliseconds instead of seconds. The technique is
Android's zygote; DESIGN.md §5 lists the precedent (TrainMover's warm-up sandbox).

Fork-safety: the zygote starts no threads and runs no torch operation before forking, so the
child inherits no held locks and no thread pool; CUDA is never initialised here.

Lifetime: the zygote dies when the agent does (EOF on stdin), and every fork dies with the zygote
(PR_SET_PDEATHSIG) or when the shim that asked for it goes away (EOF on its connection).
"""

from __future__ import annotations

import atexit
import ctypes
import faulthandler
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import traceback

PR_SET_PDEATHSIG = 1
MAX_MESSAGE = 1 << 20
# torch._dynamo is what DistributedDataParallel imports on first use (~1 s here, 800 modules).
DEFAULT_PRELOAD = "torch,torch.distributed,torch.nn.parallel,torch.distributed.run,torch._dynamo"


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

    def preload(self, modules: str) -> None:
        for name in filter(None, (m.strip() for m in modules.split(","))):
            importlib.import_module(name)

    def serve(self) -> None:
        self.selector.register(self.listener, selectors.EVENT_READ, ("accept", None))
        self.selector.register(sys.stdin, selectors.EVENT_READ, ("agent", None))
        signal.signal(signal.SIGTERM, lambda *_: self.shutdown())
        while True:
            for key, _ in self.selector.select():
                what, pid = key.data
                try:
                    if what == "accept":
                        self._accept()
                    elif what == "agent":
                        if not os.read(sys.stdin.fileno(), 4096):
                            self.shutdown()
                    elif what == "exited":
                        self._reap(pid)
                    elif what == "conn":
                        self._on_conn(pid)
                except Exception:  # noqa: BLE001 - one bad request must not take the zygote down
                    traceback.print_exc()

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        try:
            data, fds, _flags, _addr = socket.recv_fds(conn, MAX_MESSAGE, 3)
            request = json.loads(data)
        except (OSError, ValueError):
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self._become(request, fds, conn)  # never returns
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.children[pid] = (conn, pidfd)
        self.selector.register(pidfd, selectors.EVENT_READ, ("exited", pid))
        self.selector.register(conn, selectors.EVENT_READ, ("conn", pid))
        _send(conn, {"pid": pid})

    def _reap(self, pid: int) -> None:
        conn, pidfd = self.children.pop(pid)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        _send(conn, {"signal": -code, "exit_code": None} if code < 0 else
              {"signal": None, "exit_code": code})
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

    def _become(self, request: dict, fds: list[int], conn: socket.socket) -> None:
        """In the forked child: take the shim's stdio, environment and arguments, and run."""
        code = 1
        try:
            os.setsid()
            self.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            for other_conn, pidfd in self.children.values():
                other_conn.close()
                os.close(pidfd)
            conn.close()
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGPIPE):
                signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)
            self.selector.close()
            self.listener.close()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            os.environ.clear()
            os.environ.update(request["env"])
            os.chdir(request["cwd"])
            sys.stdin = open(0, "r", closefd=False)
            sys.stdout = open(1, "w", buffering=1, closefd=False)
            sys.stderr = open(2, "w", buffering=1, closefd=False)
            code = _run(request)
        except SystemExit as e:
            code = _exit_code(e)
        except BaseException as e:
            _print_user_traceback(e)
            code = 1
        finally:
            try:
                atexit._run_exitfuncs()  # as a normal exit would; C++ static teardown is skipped
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)


def _run(request: dict) -> int:
    mode, argv = request["mode"], request["argv"]
    sys.argv = list(argv)
    if mode != "torchrun":
        # Zero-code stack dumps for hang reports (ftrun.runtime registers the same on first use).
        faulthandler.register(signal.SIGUSR2, file=sys.stderr, all_threads=True)
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and "torch" in sys.modules:
        # A fresh interpreter would read OMP_NUM_THREADS when torch loads; this one already has.
        sys.modules["torch"].set_num_threads(int(threads))
    if mode == "torchrun":
        from torch.distributed.run import main
        main(argv[1:])
        return 0
    if mode == "module":
        sys.path[0] = os.getcwd()
        runpy.run_module(request["target"], run_name="__main__", alter_sys=True)
        return 0
    script = os.path.abspath(request["target"])
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")
    return 0


def _print_user_traceback(e: BaseException) -> None:
    """Print the traceback as a plain `python script.py` would: without our frames above it."""
    tb = e.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>")
                              or tb.tb_frame.f_code.co_filename.endswith("runpy.py")):
        tb = tb.tb_next
    traceback.print_exception(type(e), e, tb or e.__traceback__)


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


def _send(conn: socket.socket, body: dict) -> None:
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
    zygote = Zygote(path)  # listen first: shims that connect while we import just wait
    zygote.preload(os.environ.get("FTRUN_ZYGOTE_PRELOAD", DEFAULT_PRELOAD))
    zygote.serve()


if __name__ == "__main__":
    main()
