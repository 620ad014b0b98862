"""Live status of a real job: `ftrun status --watch` in a real pseudo-terminal (refreshing,
resized, Ctrl-C), Prometheus metrics scraped while it runs and gone after, and the notes that
say what a long wait is waiting for."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import termios
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Ftrun, Output, wait_for

# Steps slowly; the first generation waits 12 s before its first step (a slow start), then
# rank 1 dies at step 40 once: the next generation starts at once and runs to the end, or until
# the stop file (argv[3], if given) exists.
SCRIPT = """
import os, sys, time
import torch.distributed as dist
import ftrun
dist.init_process_group("gloo")
rank = dist.get_rank()
marker = sys.argv[1]
first = not os.path.exists(marker)
if first:
    time.sleep(12)
stop = sys.argv[3] if len(sys.argv) > 3 else None
for step in range(1, int(sys.argv[2]) + 1):
    if stop and os.path.exists(stop):
        break
    time.sleep(0.05)
    ftrun.step(step)
    if first and rank == 1 and step == 40:
        open(marker, "w").close()
        os.kill(os.getpid(), 9)
dist.destroy_process_group()
"""


def read_pty(fd: int, until: float) -> str:
    out = b""
    while time.monotonic() < until:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    return out.decode("utf-8", "replace")


def exit_code_draining(pid: int, fd: int, timeout_s: float) -> tuple[int | None, str]:
    """The child's exit code (None: still running after `timeout_s`) and what it wrote meanwhile.
    The terminal is read all along, as a real one is: a child blocked writing to a full
    terminal cannot exit."""
    deadline = time.monotonic() + timeout_s
    out = ""
    while time.monotonic() < deadline:
        out += read_pty(fd, min(deadline, time.monotonic() + 0.5))
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), out + read_pty(fd, time.monotonic() + 0.2)
    return None, out


def set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def value(figures: dict[str, list], name: str) -> float | None:
    """The value of an unlabelled metric; None when it has no sample (yet)."""
    samples = figures.get(name) or []
    return samples[0].value if samples else None


def scrape(port: int) -> dict[str, list]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_metrics_and_the_notes_of_a_slow_start(ftrun: Ftrun, tmp_path: Path) -> None:
    script = tmp_path / "slow_start.py"
    script.write_text(SCRIPT)
    # 200 steps: generation 2 trains up to 10 s (0.05 s a step), for the scrapes of it below,
    # which take a few polls; the stop file ends it once they are done.
    stop = tmp_path / "stop"
    proc = ftrun.start(
        "launch", "--metrics-port", "0", "--nproc-per-node", "2",
        str(script), str(tmp_path / "crashed-once"), "200", str(stop),
    )  # fmt: skip
    out = Output(proc)
    try:
        out.wait_for("metrics for Prometheus: http://127.0.0.1:", 60)
        port = int(re.findall(r"127\.0\.0\.1:(\d+)", "".join(out.lines))[0])
        out.wait_for("generation 1: no step yet after 1", 40)  # after 10 s, not a scroll
        assert sum("no step yet" in line for line in out.lines) == 1
        assert value(scrape(port), "ftrun_step") is None  # no step yet: no figure, no error
        wait_for(lambda: (value(scrape(port), "ftrun_step") or 0) >= 5, 60, "ftrun_step >= 5")
        wait_for(lambda: value(scrape(port), "ftrun_generation") == 2, 60, "generation 2")
        wait_for(lambda: value(scrape(port), "ftrun_step") is not None, 60, "a step in gen 2")
        figures = scrape(port)
        incidents = [s for s in figures["ftrun_incidents"] if s.name == "ftrun_incidents_total"]
        assert [(s.labels["kind"], s.value) for s in incidents] == [("crash", 1.0)]
        assert 0 < (value(figures, "ftrun_goodput_ratio") or 0) < 1
        stop.write_text("")
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
        raise AssertionError("the metrics port still answers after the job")
    except OSError:
        pass


def test_watch_refreshes_in_a_terminal_follows_a_resize_and_leaves_on_ctrl_c(
    ftrun: Ftrun, tmp_path: Path
) -> None:
    script = tmp_path / "slow_start.py"
    script.write_text(SCRIPT)
    (tmp_path / "crashed-once").write_text("")  # no slow start, no crash: it just steps
    job = ftrun.start("launch", "--nproc-per-node", "2", str(script),
                      str(tmp_path / "crashed-once"), "100000")  # fmt: skip
    out = Output(job)
    pid, fd = pty.fork()
    if pid == 0:  # the child: `ftrun status --watch` on a terminal 120 columns wide
        os.environ.update(ftrun.env)
        os.environ.pop("COLUMNS", None)
        os.environ["PYTHONFAULTHANDLER"] = "1"
        os.execv(os.sys.executable, [os.sys.executable, "-m", "ftrun", "status", "--watch"])
    try:
        set_size(fd, 40, 120)
        out.wait_for("generation 1", 60)
        # Refreshed frames, until two show the step moving on (a loaded machine may take a
        # while to the first step).
        raw, wide, deadline = "", [], time.monotonic() + 60
        while not (len(wide) >= 2 and wide[-1] > wide[0]) and time.monotonic() < deadline:
            raw += read_pty(fd, time.monotonic() + 1)
            seen = ANSI.sub("", raw)  # whole: an escape may be split between two reads
            wide = [int(m) for m in re.findall(r"running\s+1\s+-\s+1 active\s+(\d+)", seen)]
        assert "GOODPUT" in seen and len(wide) >= 2 and wide[-1] > wide[0], seen[-3000:]
        set_size(fd, 40, 70)
        os.kill(pid, signal.SIGWINCH)
        narrow = ANSI.sub("", read_pty(fd, time.monotonic() + 4))
        assert "steps/s" in narrow and "goodput" in narrow, narrow[-2000:]  # blocks now
        os.kill(pid, signal.SIGINT)
        code, rest = exit_code_draining(pid, fd, 30)
        if code is None:  # say where it is stuck: faulthandler dumps every thread on SIGABRT
            os.kill(pid, signal.SIGABRT)
            _, stacks = exit_code_draining(pid, fd, 10)
            raise AssertionError(f"the watch did not leave on Ctrl-C:\n{rest[-2000:]}{stacks}")
        assert code == 0, rest[-2000:]
        assert "Traceback" not in rest and "KeyboardInterrupt" not in rest
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(fd)
        os.killpg(job.pid, signal.SIGINT)
        job.wait(timeout=60)
