"""The parent of every process ftrun starts under torchrun, run as `python -u rank_shim.py MODE ...`.

MODE `torchrun`: becomes torchrun (exec, or a fork of the agent's warm interpreter).
MODE `rank`:     torchrun's entrypoint for each rank. It points the rank's output at its per-rank
                 log file, starts the rank (a fork of the warm interpreter, or a plain subprocess)
                 and tells the agent at once, over a datagram socket, that the rank started and
                 how it exited: exact exit codes and signals, with no polling.

Either way the shim exits the way its child did, so torchrun sees what it would have seen, and it
dies with its parent (PR_SET_PDEATHSIG), which takes the forked child with it.

Standard library only, and no ftrun imports: it runs as a plain file from torchrun.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
FORWARDED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGQUIT,
)
ZYGOTE_MAX_MESSAGE = 1 << 20
# How long a shim waits for the warm interpreter's answer (a pid, or "start it cold"). The first
# answers come once it has imported torch (seconds, more on a loaded host), later ones within
# milliseconds; one that takes this long is stuck, and the child starts cold rather than never.
ZYGOTE_REPLY_TIMEOUT_S = 120.0


def die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def tell_agent(event: dict) -> None:
    path = os.environ.get("FTRUN_AGENT_SOCK")
    if not path:
        return
    event.setdefault("g", int(os.environ.get("FTRUN_GENERATION", "0")))
    event.setdefault("t", time.time())
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.setblocking(False)
            s.sendto(json.dumps(event).encode(), path)
    except OSError:
        pass  # the agent is gone; torchrun and the controller will notice by other means


def exit_like(status: dict) -> None:
    """Exit with the child's code, or die of the child's signal."""
    sys.stdout.flush()
    sys.stderr.flush()
    sig = status.get("signal")
    if sig:
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        time.sleep(1)  # the signal is pending; this line is reached only if it was blocked
        os._exit(128 + sig)
    os._exit(status.get("exit_code") or 0)


def status_of(waitstatus_code: int) -> dict:
    if waitstatus_code < 0:
        return {"signal": -waitstatus_code, "exit_code": None}
    return {"signal": None, "exit_code": waitstatus_code}


def warm_request(mode: str, argv: list[str]) -> dict | None:
    """How the warm interpreter should run this command, or None if it cannot (a non-Python
    entrypoint, or python with options other than -u)."""
    if mode == "torchrun":
        return {
            "mode": "torchrun",
            "argv": ["torchrun", *argv],
            "cmdline": [sys.executable, "-u", "-m", "torch.distributed.run", *argv],
        }
    if (
        len(argv) >= 3
        and argv[1] == "-u"
        and os.path.realpath(argv[0]) == os.path.realpath(sys.executable)
    ):
        if argv[2] == "-m" and len(argv) >= 4:
            return {
                "mode": "module",
                "target": argv[3],
                "argv": [argv[3], *argv[4:]],
                "cmdline": list(argv),
            }
        if not argv[2].startswith("-"):
            return {"mode": "script", "target": argv[2], "argv": argv[2:], "cmdline": list(argv)}
    return None


def exec_identity() -> dict:
    """What an exec'd child would inherit from us beyond stdio, env and cwd: the umask and the
    signals we ignore (exec keeps SIG_IGN). Read before we install our forwarding handlers."""
    mask = os.umask(0)
    os.umask(mask)
    ignored = [
        int(s)
        for s in signal.valid_signals()
        if isinstance(s, signal.Signals)
        and s not in (signal.SIGPIPE, signal.SIGXFSZ)
        and _ignored(s)
    ]
    return {"umask": mask, "ignored_signals": ignored}


def _ignored(sig: signal.Signals) -> bool:
    try:
        return signal.getsignal(sig) is signal.SIG_IGN
    except (OSError, ValueError):
        return False


def run_warm(zygote_path: str, request: dict, fds: list[int]) -> dict | None:
    """Ask the zygote to fork the child. Returns its exit status, or None if the zygote could not
    be reached at all or refused (the caller then starts the child cold)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(ZYGOTE_REPLY_TIMEOUT_S)
    try:
        sock.connect(zygote_path)
    except OSError:
        sock.close()
        return None
    request.update(env=dict(os.environ), cwd=os.getcwd(), **exec_identity())
    try:
        socket.send_fds(sock, [json.dumps(request).encode()], fds)
        reply = sock.recv(ZYGOTE_MAX_MESSAGE)
    except TimeoutError:
        # Closing our end tells the zygote we gave up: it forks nothing for this request (or
        # kills at once what it forked just now: EOF on the connection).
        sock.close()
        print(
            f"ftrun: starting cold: the warm interpreter did not answer within "
            f"{ZYGOTE_REPLY_TIMEOUT_S:g} s",
            file=sys.stderr,
        )
        return None
    if not reply:
        return None
    # From here we wait for the child's exit status: as long as the child runs.
    sock.settimeout(None)
    answer = json.loads(reply)
    if "cold" in answer:
        print(f"ftrun: starting cold: {answer['cold']}", file=sys.stderr)
        return None
    pid = answer["pid"]
    on_started(pid)
    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, lambda s, _f: _killpg_quietly(pid, s))
    while True:
        try:
            reply = sock.recv(ZYGOTE_MAX_MESSAGE)
            break
        except InterruptedError:
            continue
    if not reply:  # the zygote died under us; its children died with it
        return {"signal": signal.SIGKILL, "exit_code": None, "pid": pid}
    status = json.loads(reply)
    status["pid"] = pid
    return status


def run_cold(argv: list[str], *, stdout: int | None) -> dict:
    # The child shares our process group, which torchrun signals as a whole.
    proc = subprocess.Popen(
        argv,
        stdout=stdout,
        stderr=subprocess.STDOUT if stdout else None,
        preexec_fn=die_with_parent,
    )
    on_started(proc.pid)
    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, lambda s, _f: _kill_quietly(proc.pid, s))
    while True:
        try:
            code = proc.wait()
            break
        except InterruptedError:
            continue
    status = status_of(code)
    status["pid"] = proc.pid
    return status


def _killpg_quietly(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except OSError:
        pass


def _kill_quietly(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def on_started(pid: int) -> None:
    tell_agent({"e": "started", "r": _rank(), "pid": pid, "shim": os.getpid()})


def _rank() -> int:
    return int(os.environ.get("RANK", "-1")) if MODE == "rank" else -1


def apply_contract_env() -> None:
    """torchrun sets TORCHELASTIC_RESTART_COUNT and TORCHELASTIC_MAX_RESTARTS for its own restarts,
    always 0 under ftrun (which restarts job-wide): the agent passes ftrun's values, with an
    FTRUN_ prefix, and they replace torchrun's here, before the rank starts."""
    for name in ("TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS"):
        value = os.environ.get("FTRUN_" + name)
        if value is not None:
            os.environ[name] = value


def main(argv: list[str]) -> None:
    die_with_parent()
    if os.getppid() == 1:
        os._exit(137)  # the parent died before prctl took effect
    zygote = os.environ.get("FTRUN_ZYGOTE_SOCK")
    if MODE == "torchrun":
        request = warm_request("torchrun", argv)
        status = run_warm(zygote, request, [0, 1, 2]) if zygote and request else None
        if status is None:
            os.execv(sys.executable, [sys.executable, "-u", "-m", "torch.distributed.run", *argv])
        exit_like(status)
    apply_contract_env()
    log_dir = os.environ.get("FTRUN_RANK_LOG_DIR")
    log_fd = None
    if log_dir:
        log_fd = os.open(
            os.path.join(log_dir, f"rank{_rank()}.log"),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
            0o644,
        )
    request = warm_request("rank", argv) if zygote else None
    out = log_fd if log_fd is not None else 1
    status = run_warm(zygote, request, [0, out, out]) if zygote and request else None
    if status is None:
        status = run_cold(argv, stdout=log_fd)
    tell_agent(
        {
            "e": "exited",
            "r": _rank(),
            "pid": status["pid"],
            "code": status["exit_code"],
            "sig": status["signal"],
        }
    )
    exit_like(status)


if __name__ == "__main__":
    MODE = sys.argv[1]
    main(sys.argv[2:])
