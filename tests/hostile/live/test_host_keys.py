"""Live attacks on host-key checking (issue 11 finding 2), on the ssh testbed: a host whose key is
not known, and one whose key changed (what an impostor on its address looks like), are refused
before anything reaches them, with the message that says why; the opt-out flag lets them
through; the testbed's own known_hosts (every testbed test) is the case that works.

"Nothing reached the host" is read from the host's sshd log: the client never authenticated,
so no agent was started and no bootstrap (with the job secret) was written to any session."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import BIN
from tests.testbed import Testbed, ssh_testbed_fixture

HELLO = str(BIN / "hello.sh")
testbed = ssh_testbed_fixture(2, scope="module", prefix="fthk", subnet="10.213.63.0/24")


def ssh_config_with(bed: Testbed, tmp_path: Path, known_hosts: str) -> Path:
    """The testbed's ssh config, pointed at a known_hosts file with this text."""
    (tmp_path / "known_hosts").write_text(known_hosts)
    text = bed.ssh_config.read_text()
    original = str(bed.state_dir / "known_hosts")
    assert original in text
    config = tmp_path / "ssh_config"
    config.write_text(text.replace(original, str(tmp_path / "known_hosts")))
    return config


def known_lines(bed: Testbed) -> list[str]:
    return (bed.state_dir / "known_hosts").read_text().splitlines()


def logins(bed: Testbed, host: str) -> int:
    """Successful logins on the host so far (sshd's log)."""
    return (bed.state_dir / host / "sshd.log").read_text().count("Accepted publickey")


def launch(ftrun, config: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return ftrun.run(
        "launch",
        "--ssh-config",
        str(config),
        "--hosts",
        "node1,node2",
        "--min-nodes",
        "2",
        *flags,
        "--no-python",
        HELLO,
        timeout=120,
    )


def refused_on_node2(ftrun, bed: Testbed, result, before: int) -> str:
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert logins(bed, "node2") == before  # never authenticated: no agent, no secret
    [job] = ftrun.status_json()
    # The agent's log is opened before the host is dialled (through the job directory's
    # descriptor, ftrun/jobfiles.py): no agent ever wrote to it.
    agent_log = ftrun.run_dir / job["job_id"] / "agents" / "node2.log"
    assert not agent_log.exists() or agent_log.read_bytes() == b""
    assert "hello from shell" not in result.stdout
    [event] = [
        e
        for e in ftrun.events(job["job_id"])
        if e["kind"] == "host_unreachable" and e["host"] == "node2" and not e["retry"]
    ]
    return str(event["error"])


def test_an_unknown_host_key_is_refused(ftrun, testbed: Testbed, tmp_path: Path):
    lines = [line for line in known_lines(testbed) if not line.startswith("node2,")]
    config = ssh_config_with(testbed, tmp_path, "\n".join(lines) + "\n")
    before = logins(testbed, "node2")
    result = launch(ftrun, config)
    error = refused_on_node2(ftrun, testbed, result, before)
    assert "its SSH host key is not known (ed25519 SHA256:" in error
    assert "cannot reach node2 over ssh: its SSH host key is not known" in result.stderr
    assert "ssh-keyscan -H 10.213.63.12 >>" in result.stderr
    assert "--insecure-skip-host-key-check" in result.stderr
    assert (tmp_path / "known_hosts").read_text() == "\n".join(lines) + "\n"  # not added


def test_a_changed_host_key_is_refused_as_a_possible_attack(ftrun, testbed: Testbed, tmp_path):
    impostor = tmp_path / "impostor"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(impostor)],
        check=True,
        timeout=30,
    )
    fake = " ".join(impostor.with_suffix(".pub").read_text().split()[:2])
    lines = [
        f"node2,10.213.63.12 {fake}" if line.startswith("node2,") else line
        for line in known_lines(testbed)
    ]
    config = ssh_config_with(testbed, tmp_path, "\n".join(lines) + "\n")
    before = logins(testbed, "node2")
    result = launch(ftrun, config)
    error = refused_on_node2(ftrun, testbed, result, before)
    assert "its SSH host key CHANGED" in error and "man-in-the-middle" in error
    assert f"ssh-keygen -R 10.213.63.12 -f {tmp_path / 'known_hosts'}" in result.stderr


@pytest.mark.parametrize("how", ["flag", "config"])
def test_the_opt_out_lets_an_unknown_key_through(ftrun, testbed: Testbed, tmp_path, how):
    config = ssh_config_with(testbed, tmp_path, "")  # no key known at all
    if how == "flag":
        result = launch(ftrun, config, "--insecure-skip-host-key-check")
    else:
        config.write_text(
            config.read_text().replace("StrictHostKeyChecking yes", "StrictHostKeyChecking no")
        )
        result = launch(ftrun, config)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "hello from shell rank=0" in result.stdout and "rank=1" in result.stdout
    [job] = ftrun.status_json()
    log = (ftrun.run_dir / job["job_id"] / "controller.log").read_text()
    assert log.count("ssh host keys are NOT checked") == 1  # said once, not once per host
    if how == "flag":
        assert "NOT checked (--insecure-skip-host-key-check)" in result.stderr


def test_known_keys_work_and_accept_new_adds_the_missing_one(ftrun, testbed, tmp_path):
    lines = [line for line in known_lines(testbed) if not line.startswith("node2,")]
    config = ssh_config_with(testbed, tmp_path, "\n".join(lines) + "\n")
    config.write_text(
        config.read_text().replace("StrictHostKeyChecking yes", "StrictHostKeyChecking accept-new")
    )
    result = launch(ftrun, config)
    assert result.returncode == 0, result.stdout + result.stderr
    added = (tmp_path / "known_hosts").read_text().splitlines()[len(lines) :]
    node2_key = next(x for x in known_lines(testbed) if x.startswith("node2,")).split(" ", 1)[1]
    assert added == [f"10.213.63.12 {node2_key}"]
