"""Turn a fork of the warm interpreter into what `python -u script.py` (or `-m mod`) would be.

A warm-started rank must be indistinguishable from a fresh interpreter, because scripts depend
on its lifecycle in ways nobody writes down. The one that hurt: a DDP script on gloo without
`destroy_process_group()` hung at exit when its globals were dropped right after the script
returned (the Reducer frees ProcessGroupGloo, whose destructor joins a worker thread that waits
for the GIL). Under `python script.py` the globals live in the real `__main__` until interpreter
finalization, where a thread that asks for the GIL exits instead of waiting, so that order never
hangs. So the fork does not run the script inside the zygote's frames and `os._exit()`; it
unwinds out of the zygote's loop, runs the code in a fresh `sys.modules["__main__"]`, and returns
to the interpreter, which finalizes exactly as after `python script.py`: non-daemon threads
joined, `atexit` handlers, module teardown, `sys.exit` codes and uncaught exceptions printed by
`sys.excepthook` (KeyboardInterrupt ends in SIGINT, as CPython does).

`prepare()` gives the fork the identity a fresh exec would have: stdio on the shim's descriptors
(unbuffered, as torchrun's `python -u`), environment, cwd, umask, argv, `sys.path[0]`, signal
dispositions and mask, a reseeded NumPy, its own command line for `ps` (`ftrun rank R/W
script.py args`) and its own environment in /proc/PID/environ.
"""

from __future__ import annotations

import builtins
import faulthandler
import io
import os
import runpy
import signal
import sys
import types
from typing import Any

from ftrun.agent import gloo_quiesce, proctitle

# agent/stacks.py's STACKS_SIGNAL, not imported from there: a rank must not load the agent's
# modules (psutil, asyncio) just for a number.
STACKS_SIGNAL = int(signal.SIGRTMIN) + 2

# Frames of ours that sit above the user's code; tracebacks start below them, as under python.
_OUR_FILES = {
    os.path.abspath(__file__),
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "zygote.py"),
}
# Signals CPython itself sets at start-up; every other one starts at its inherited disposition.
_PYTHON_IGNORES = (signal.SIGPIPE, signal.SIGXFSZ)


def prepare(request: dict[str, Any]) -> None:
    """Everything a fresh exec of the request's command would have set up before its first line."""
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    if "umask" in request:
        os.umask(int(request["umask"]))
    _reset_signals(set(request.get("ignored_signals", ())))
    _open_stdio()
    if request["mode"] != "torchrun":
        # Zero-code stack dumps for hang reports (ftrun.runtime registers the same on first
        # use), as early as can be: a hang report may come while we are still starting.
        faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True)
    sys.orig_argv = list(request.get("cmdline") or sys.orig_argv)
    proctitle.set_title(_title(request))
    # /proc/PID/environ shows the environment the rank runs with, as a cold rank's does.
    proctitle.set_environ(os.environb)
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()  # a fresh interpreter seeds its own; every fork shares the zygote's
    if request["mode"] != "torchrun":
        gloo_quiesce.install()  # torch's gloo exit deadlock, made unlikely by a busy machine
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and "torch" in sys.modules:
        # A fresh interpreter reads OMP_NUM_THREADS when torch loads; this one already has.
        sys.modules["torch"].set_num_threads(int(threads))


def _title(request: dict[str, Any]) -> str:
    """`ftrun rank R/W train.py --lr 3` for a rank; torchrun keeps its own command line."""
    if request["mode"] == "torchrun":
        return " ".join(request.get("cmdline") or request["argv"])
    return proctitle.rank_title(os.environ, request["argv"], module=request["mode"] == "module")


def run(request: dict[str, Any]) -> None:
    """Run the request's script or module in a fresh `__main__`. Returns when it does (the
    caller then lets the interpreter finalize) or raises what it raised."""
    mode = request["mode"]
    if mode == "torchrun":
        from torch.distributed.run import main

        sys.argv = list(request["argv"])
        main(sys.argv[1:])
        return
    try:
        if mode == "module":
            _run_module(request["target"], request["argv"])
        else:
            _run_script(request["target"], request["argv"])
    except SystemExit:
        raise
    except BaseException:
        # Printed by the interpreter through sys.excepthook once it unwinds past our frames;
        # the wrapper drops those frames so the traceback reads as under `python script.py`.
        sys.excepthook = _StripOurFrames(sys.excepthook)
        raise
    finally:
        from ftrun import runtime

        runtime.code_done()


def _run_script(target: str, argv: list[str]) -> None:
    main = _fresh_main()
    path = os.path.abspath(target)  # CPython 3.9+: __main__.__file__ is absolute, links kept
    sys.argv = list(argv)
    if not os.path.exists(path):
        print(
            f"{sys.orig_argv[0]}: can't open file {path!r}: [Errno 2] No such file or directory",
            file=sys.stderr,
        )
        raise SystemExit(2)
    if os.path.isdir(path) or not _is_source(path):
        # A directory or zip with __main__.py: python puts it on sys.path and runs __main__.
        sys.path[0] = path
        runpy._run_module_as_main("__main__", alter_argv=False)  # type: ignore[attr-defined]
        return
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    with io.open_code(path) as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    namespace = main.__dict__
    namespace.update(__file__=path, __cached__=None, __loader__=_source_loader(path))
    try:
        exec(code, namespace)
    finally:
        # As CPython's _PyRun_SimpleFileObject: __file__ is gone by the time atexit runs.
        namespace.pop("__file__", None)
        namespace.pop("__cached__", None)


def _run_module(target: str, argv: list[str]) -> None:
    _fresh_main()
    sys.argv = [target, *argv[1:]]  # runpy replaces argv[0] with the module's file
    sys.path[0] = os.getcwd()
    runpy._run_module_as_main(target, alter_argv=True)  # type: ignore[attr-defined]


def _fresh_main() -> types.ModuleType:
    """A new `__main__` in sys.modules, shaped like the one CPython makes at start-up. The
    zygote's own module stays alive through the frames that run us."""
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __builtins__=builtins, __annotations__={}, __package__=None, __spec__=None, __loader__=None
    )
    sys.modules["__main__"] = main
    return main


def _source_loader(path: str) -> Any:
    from importlib.machinery import SourceFileLoader

    return SourceFileLoader("__main__", path)


def _is_source(path: str) -> bool:
    """A plain file that is not a zip archive (python runs a zip's __main__.py, any suffix)."""
    import zipfile

    try:
        return os.path.isfile(path) and not zipfile.is_zipfile(path)
    except OSError:
        return True  # unreadable: compiling it gives python's own error


def _reset_signals(ignored: set[int]) -> None:
    """Dispositions as after exec + CPython start-up: what the shim ignored stays ignored (exec
    keeps SIG_IGN), SIGINT raises KeyboardInterrupt, SIGPIPE/SIGXFSZ ignored, the rest default;
    no signal blocked."""
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP) or not isinstance(sig, signal.Signals):
            continue
        if sig in ignored or sig in _PYTHON_IGNORES:
            handler: Any = signal.SIG_IGN
        elif sig == signal.SIGINT:
            handler = signal.default_int_handler
        else:
            handler = signal.SIG_DFL
        try:
            if signal.getsignal(sig) is not handler:
                signal.signal(sig, handler)
        except (OSError, ValueError):
            continue
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _open_stdio() -> None:
    """sys.stdin/stdout/stderr on fds 0-2 as `python -u` makes them: unbuffered binary layer,
    write-through text layer, the zygote's encoding and error handlers (same locale)."""
    old = (sys.stdin, sys.stdout, sys.stderr)
    stdin = io.TextIOWrapper(
        open(0, "rb", closefd=False),
        encoding=old[0].encoding,
        errors=old[0].errors,
        line_buffering=False,
    )
    streams = [stdin]
    for fd, previous in ((1, old[1]), (2, old[2])):
        raw = open(fd, "wb", buffering=0, closefd=False)
        streams.append(
            io.TextIOWrapper(
                # Unbuffered, as `python -u` wraps it; typeshed only admits a buffered stream.
                raw,  # type: ignore[arg-type]
                encoding=previous.encoding,
                errors=previous.errors,
                newline="\n",
                line_buffering=False,
                write_through=True,
            )
        )
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams  # type: ignore[misc]


class _StripOurFrames:
    """sys.excepthook wrapper: print the traceback from the first frame that is not ours."""

    def __init__(self, hook: Any) -> None:
        self.hook = hook

    def __call__(self, kind: type[BaseException], value: BaseException, tb: Any) -> None:
        while tb is not None and _ours(tb.tb_frame.f_code.co_filename):
            tb = tb.tb_next
        sys.excepthook = self.hook
        # The built-in hook prints value.__traceback__, not its tb argument: set both.
        self.hook(kind, value.with_traceback(tb), tb)


def _ours(filename: str) -> bool:
    return filename in _OUR_FILES or filename == "<frozen runpy>" or filename.endswith("runpy.py")
