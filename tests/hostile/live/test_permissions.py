"""What a job writes is the user's only (issue 11 finding 6): a real launch, a checkpoint written
by a rank, and the mode of everything in the job directory, by default (0700/0600) and with
--group-readable (0750/0640). The launcher runs here under umask 022, as a shell usually does:
the modes must come from ftrun, not from the caller's umask."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.conftest import BIN, Output, wait_for
from tests.testbed import ssh_testbed_fixture

TRAIN = str(BIN / "ckpt_train.py")


def modes(root: Path) -> dict[str, int]:
    """Every path under root (and root itself, as "."): its permission bits."""
    out = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        out[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return out


def test_a_job_is_private_by_default(ftrun):
    run(ftrun, (), 0o700, 0o600)


def test_group_readable_lets_the_group_read(ftrun):
    run(ftrun, ("--group-readable",), 0o750, 0o640)


def run(ftrun, flags: tuple[str, ...], dir_mode: int, file_mode: int) -> None:
    old = os.umask(0o022)
    try:
        proc = ftrun.start(
            "launch", *flags, TRAIN, "--steps", "6", "--step-time", "0.3", "--no-memory"
        )
    finally:
        os.umask(old)
    out = Output(proc)
    try:
        job_dir = wait_for(
            lambda: next(iter(ftrun.run_dir.glob("*/control.json")), None), 60, "control.json"
        ).parent
        control = stat.S_IMODE((job_dir / "control.json").stat().st_mode)
        assert proc.wait(timeout=120) == 0, out.text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert control == 0o600  # the job secret: never more, whatever the flag
    assert stat.S_IMODE(ftrun.run_dir.stat().st_mode) == dir_mode  # the run dir we created
    found = modes(job_dir)
    for name in ("events.jsonl", "config.json", "controller.log", "logs/g1/rank0.log"):
        assert found[name] == file_mode, (name, oct(found[name]))
    assert found["agents/localhost.log"] == file_mode
    assert found["."] == dir_mode and found["logs"] == dir_mode
    checkpoints = {k: v for k, v in found.items() if k.startswith("checkpoints/")}
    assert any(k.endswith(".pt") or "manifest" in k for k in checkpoints), sorted(found)
    for name, mode in found.items():
        # Nothing for other users, nothing the group may change; the checkpoint module may be
        # stricter than the umask (0600/0700 of its own), never looser.
        assert mode & 0o007 == 0 and mode & 0o020 == 0, (name, oct(mode))
        if name == "checkpoint.key":
            assert mode == 0o600, oct(mode)  # a secret, like control.json: whatever the flag
        elif not name.startswith("checkpoints"):
            expected = dir_mode if (job_dir / name).is_dir() else file_mode
            assert mode == expected, (name, oct(mode))


def test_an_existing_run_dir_keeps_its_mode(ftrun):
    ftrun.run_dir.mkdir(mode=0o755)
    os.chmod(ftrun.run_dir, 0o755)
    result = ftrun.run("launch", "--no-python", str(BIN / "hello.sh"))
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(ftrun.run_dir.stat().st_mode) == 0o755  # the user's choice
    [job_dir] = [p for p in ftrun.run_dir.iterdir() if p.is_dir()]
    assert stat.S_IMODE(job_dir.stat().st_mode) == 0o700  # ours


testbed = ssh_testbed_fixture(1, scope="module", prefix="fthk", subnet="10.213.63.0/24")


@pytest.mark.parametrize(
    ("flags", "file_mode", "dir_mode"), [((), 0o600, 0o700), (("--group-readable",), 0o640, 0o750)]
)
def test_an_agent_over_ssh_gives_its_ranks_the_umask(ftrun, testbed, flags, file_mode, dir_mode):
    """sshd starts the agent's session with its own umask (022): the agent sets the one the
    Bootstrap carries before any rank starts, so what ranks write on a remote host is as private
    as what the controller writes."""
    probe = testbed.ssh("node1", "umask").stdout.strip()
    assert probe == "0022", probe  # else this test would pass without the Bootstrap's umask
    result = ftrun.run(
        "launch",
        "--ssh-config",
        str(testbed.ssh_config),
        "--hosts",
        "node1",
        *flags,
        "--no-python",
        str(BIN / "write_files.sh"),
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    [job_dir] = [p for p in ftrun.run_dir.iterdir() if p.is_dir()]
    assert stat.S_IMODE((job_dir / "from-rank0.txt").stat().st_mode) == file_mode
    assert stat.S_IMODE((job_dir / "dir-of-rank0").stat().st_mode) == dir_mode
