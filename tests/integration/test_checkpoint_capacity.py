"""A memory tier that does not fit never fails a job (issue 33): a real rank process checkpoints
every step with its tier root on a small tmpfs (0.5, 1, 2.5 and 4 x the state, and one filled
up mid-run by another writer), steps the tier down (live -> copies -> storage only) with one
warning and one datagram to the agent, persists its last step at close(), and a restart finds
it in the tier the level promises."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import BIN

STATE_MIB = 18  # >= 16 MiB: the live snapshot's floor (live.MIN_BYTES)


@pytest.fixture
def tmpfs(tmp_path):
    """Mounts a tmpfs of the asked size (MiB) in the test's temp dir; unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = []

    def mount(mib: float):
        where = tmp_path / "shm"
        where.mkdir()
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={int(mib * 2**20)}", "tmpfs", str(where)],
            check=True,
        )
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def agent_socket(tmp_path):
    """A datagram socket where an agent would be: what the rank reports."""
    path = tmp_path / "agent.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    yield sock, path
    sock.close()


def received(sock: socket.socket) -> list[dict]:
    out = []
    while True:
        try:
            out.append(json.loads(sock.recv(65536)))
        except BlockingIOError:
            return out


def run_rank(tmp_path, root, agent, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    env = {
        **os.environ,
        "PYTHONPATH": str(BIN.parents[1]),
        "FTRUN_AGENT_SOCK": str(agent),
        "FTRUN_GENERATION": "0",
    }
    env.pop("FTRUN_JOB_ID", None)
    cmd = [sys.executable, str(BIN / "ckpt_tight.py"), "--root", str(root)]
    cmd += ["--storage", str(tmp_path / "storage"), "--job", "tight", "--state-mib"]
    cmd += [str(STATE_MIB), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    said = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    return out, said


# tier root's size / the state, live snapshot on?, the level it ends at, where a restart finds
# it, copies kept in the tier. Three copies by default, two where the third does not fit; the
# live file takes one more state.
CASES = [
    (0.5, True, "storage", "storage", 0),
    (1.0, True, "storage", "storage", 0),
    (2.5, True, "copies", "memory", 2),
    (4.0, True, "copies", "memory", 3),
    (5.0, True, "live", "memory", 3),
    (1.0, False, "storage", "storage", 0),
    (2.5, False, "copies", "memory", 2),
    (3.5, False, "copies", "memory", 3),
]


@pytest.mark.parametrize(("times", "live", "level", "restored", "copies"), CASES)
def test_a_tier_root_of_any_size_never_fails_the_job(
    tmp_path, tmpfs, agent_socket, times, live, level, restored, copies
):
    root = tmpfs(STATE_MIB * times)
    sock, path = agent_socket
    out, said = run_rank(tmp_path, root, path, *([] if live else ["--no-live"]))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert said["LEVEL"] == level
    assert said["CLOSED"] == "6"  # close() persisted the last step
    assert said["RESTORED"] == f"6 {restored} same"
    kept_two = [line for line in out.stderr.splitlines() if "keep 2 copies, not 3" in line]
    assert len(kept_two) == (copies == 2), out.stderr
    if copies:
        assert said["SLOTS"] == str(copies)
    warnings = [line for line in out.stderr.splitlines() if "steps down" in line]
    events = [e for e in received(sock) if e.get("e") == "tier"]
    start = "live" if live else "copies"
    if level == start:
        assert warnings == [] and events == []
        return
    assert len(warnings) == 1, out.stderr  # one warning, with the figures
    assert "No space left on device" in warnings[0] and f"free of {int(STATE_MIB * times)}" in (
        warnings[0].replace(",", "")
    )
    assert [(e["from"], e["tier"]) for e in events] == [(start, level)]
    assert events[0]["need"] > 0 and events[0]["total"] > 0


def test_a_tier_root_filled_up_mid_run_never_fails_the_job(tmp_path, tmpfs, agent_socket):
    """Another writer fills the tier root after step 2: the live snapshot's next manifest finds
    no room; the rank steps down to copies (giving the live file's space back) and close()
    persists step 6 (before: close() raised ENOSPC, rc 1)."""
    root = tmpfs(STATE_MIB * 4)
    sock, path = agent_socket
    out, said = run_rank(tmp_path, root, path, "--fill-at", "2")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "FILLED" in said
    assert said["CLOSED"] == "6" and said["RESTORED"].startswith("6 ")
    assert said["RESTORED"].endswith(" same")
    assert said["LEVEL"] in ("copies", "storage")
    events = [e for e in received(sock) if e.get("e") == "tier"]
    assert events and events[0]["from"] == "live"
    assert sum("steps down" in line for line in out.stderr.splitlines()) == len(events)


def test_a_tier_another_user_planted_is_refused_as_the_root_cause_and_the_job_goes_on(
    tmp_path, agent_socket
):
    """The one name another user can still plant, this user's private parent `ftrun-<uid>`, is
    refused with the directory and why, and the rank goes on storage only (before: the rank
    died at its first checkpoint call, and `ftrun launch` said "0 usable host(s)")."""
    if os.geteuid() != 0:
        pytest.skip("planting as another user needs root")
    root = tmp_path / "shm"
    root.mkdir()
    os.chmod(root, 0o1777)  # like /dev/shm
    planted = root / f"ftrun-{os.geteuid()}"
    for name in (planted, root / "ftrun-tight"):  # the new name, and the job's old one
        name.mkdir(mode=0o700)
        os.chown(name, 65534, 65534)
    sock, path = agent_socket
    out, said = run_rank(tmp_path, root, path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert said["LEVEL"] == "storage" and said["CLOSED"] == "6"
    assert said["RESTORED"] == "6 storage same"
    warnings = [line for line in out.stderr.splitlines() if "memory tier is not used" in line]
    assert len(warnings) == 2  # the first Manager's and the restart's, each once
    assert f"{planted} is not safe to use: it is owned by uid 65534" in warnings[0]
    events = [e for e in received(sock) if e.get("e") == "tier"]
    assert len(events) == 2  # the first Manager's and the restart's
    assert all(e["tier"] == "storage" and str(planted) in e["why"] for e in events)
    assert os.listdir(planted) == []


def test_a_tier_name_another_user_can_guess_is_not_the_tier_any_more(tmp_path, agent_socket):
    """`<root>/ftrun-<job>` planted by another user (before: the rank died at its first
    checkpoint call) is not where the tier is: the job keeps its live snapshot."""
    if os.geteuid() != 0:
        pytest.skip("planting as another user needs root")
    root = tmp_path / "shm"
    root.mkdir()
    os.chmod(root, 0o1777)
    (root / "ftrun-tight").mkdir(mode=0o700)
    os.chown(root / "ftrun-tight", 65534, 65534)
    sock, path = agent_socket
    out, said = run_rank(tmp_path, root, path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert said["LEVEL"] == "live" and said["RESTORED"] == "6 memory same"
    assert [e for e in received(sock) if e.get("e") == "tier"] == []


def test_under_ftrun_launch_a_tier_that_does_not_fit_is_journaled_and_said(ftrun, tmp_path, tmpfs):
    """The rank's step-down reaches the controller (agent datagram -> checkpoint_tier message):
    journaled with the figures and said by `ftrun launch`; the hello carries /dev/shm's room;
    the job succeeds (before: it failed at the rank's second save)."""
    root = tmpfs(STATE_MIB * 1.0)
    result = ftrun.run(
        "launch",
        "--nproc-per-node",
        "1",
        str(BIN / "ckpt_tight.py"),
        "--root",
        str(root),
        "--storage",
        str(tmp_path / "storage"),
        "--job",
        "tight-launch",
        "--state-mib",
        str(STATE_MIB),
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    job = ftrun.only_job()
    assert job["state"] == "succeeded"
    events = ftrun.events(job["job_id"])
    [tier] = [e for e in events if e["kind"] == "checkpoint_tier"]  # the restart's says nothing
    assert (tier["from"], tier["tier"], tier["rank"]) == ("live", "storage", 0)
    assert tier["need"] > 0 and tier["total"] == STATE_MIB * 2**20
    assert "No space left on device" in tier["why"]
    said = result.stdout + result.stderr
    assert "rank 0: the checkpoint memory tier steps down from live to storage" in said
    connected = next(e for e in events if e["kind"] == "agent_connected")
    assert connected["shm_total"] > 0 and connected["shm_free"] >= 0
