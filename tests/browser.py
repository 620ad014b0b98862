"""Headless Chromium for tests and scripts: load a page as a person would, and read it back.

Used by tests/integration/test_timeline.py (the DOM after the page's script ran, a screenshot)
and scripts/timeline_screenshot.py (the README's picture). Chromium is found on PATH or, as
root with apt-get, installed on demand (as tests/slurmbed.py does for Slurm); `chromium_fixture`
skips with the reason otherwise.

Each run is its own process group in its own session, with a fresh profile, home and cache in a
temporary directory and a deadline; afterwards the whole group is killed, and so is any process
still holding that profile (Chromium's helpers), and the directory is removed: nothing of it
outlives the call.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

NAMES = ("chromium", "chromium-browser", "google-chrome")
INSTALL = (
    "DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -qq update && "
    "DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -qq install -y "
    "--no-install-recommends chromium"
)
INSTALL_TIMEOUT_S = 900


def find() -> str | None:
    return next((path for name in NAMES if (path := shutil.which(name))), None)


def unavailable_reason() -> str | None:
    """Why Chromium cannot be had here, or None (it is installed, or `ensure` can install it)."""
    if find():
        return None
    if os.geteuid() != 0:
        return "chromium is not installed and installing it needs root (apt-get install chromium)"
    if not shutil.which("apt-get"):
        return "chromium is not installed and there is no apt-get to install it"
    return None


def ensure() -> str:
    """The path of a Chromium, installed with apt-get first if need be; RuntimeError if not."""
    path = find()
    if path:
        return path
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    done = subprocess.run(
        ["sh", "-c", INSTALL], capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S
    )
    path = find()
    if done.returncode != 0 or not path:
        raise RuntimeError(
            f"apt-get install chromium failed ({done.returncode}): {done.stderr[-800:]}"
        )
    return path


def run(
    chromium: str,
    url: str,
    *args: str,
    timeout_s: float = 60,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`chromium --headless=new ... args url`, its stdout and stderr; TimeoutError past the
    deadline. `env` adds to the environment (a test's FTRUN_TEST_ID, so leftovers are found)."""
    with tempfile.TemporaryDirectory(prefix="ftrun-chromium-") as tmp:
        profile = Path(tmp, "profile")
        home = {"HOME": tmp, "XDG_CONFIG_HOME": tmp, "XDG_CACHE_HOME": tmp}
        proc = subprocess.Popen(
            [
                chromium,
                "--headless=new",
                "--no-sandbox",  # as root; the page is ours and loads nothing
                "--disable-gpu",
                "--no-first-run",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-sync",
                f"--user-data-dir={profile}",
                *args,
                url,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **home, **(env or {})},
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            raise TimeoutError(f"chromium did not finish {url} in {timeout_s} s") from e
        finally:
            _kill(proc.pid, str(profile))
            proc.wait(timeout=10)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def dump_dom(chromium: str, url: str, **kw: object) -> str:
    """The page's DOM after its scripts ran, as HTML."""
    done = run(chromium, url, "--dump-dom", **kw)  # type: ignore[arg-type]
    if done.returncode != 0:
        raise RuntimeError(f"chromium --dump-dom failed ({done.returncode}): {done.stderr[-800:]}")
    return done.stdout


def screenshot(chromium: str, url: str, out: Path, *, size: str = "1400,700", **kw: object) -> Path:
    done = run(chromium, url, f"--screenshot={out}", f"--window-size={size}", **kw)  # type: ignore[arg-type]
    if done.returncode != 0 or not out.is_file():
        raise RuntimeError(
            f"chromium --screenshot failed ({done.returncode}): {done.stderr[-800:]}"
        )
    return out


def _kill(pgid: int, profile: str) -> None:
    """Kill the run's process group, then any process still using its profile (a helper that
    left the group)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for proc in psutil.process_iter():
        try:
            if any(profile in arg for arg in proc.cmdline()):
                proc.kill()
        except psutil.Error:
            continue


def chromium_fixture() -> Callable[..., Any]:
    """A session fixture: the path of a Chromium, installed on first use if need be, or a skip
    with the reason. In a test module: `chromium = chromium_fixture()`."""

    @pytest.fixture(scope="session")
    def chromium() -> str:
        reason = unavailable_reason()
        if reason:
            pytest.skip(reason)
        try:
            return ensure()
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            pytest.skip(f"chromium could not be installed: {e}")

    return chromium
