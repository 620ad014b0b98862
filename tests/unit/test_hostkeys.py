"""Host-key policy (ftrun/transport/hostkeys.py) without an sshd: which StrictHostKeyChecking
value does what, which name and files a host's key is looked up under, hashed and [host]:port
entries, and what an unknown or changed key says. The live attacks are in
tests/hostile/live/test_host_keys.py."""

from __future__ import annotations

from pathlib import Path

import paramiko
import pytest

from ftrun.errors import HostUnreachable
from ftrun.transport import hostkeys
from ftrun.transport.hostkeys import ACCEPT_NEW, OFF, STRICT, HostKeyError


@pytest.fixture(scope="module")
def keys() -> tuple[paramiko.PKey, paramiko.PKey]:
    return paramiko.ECDSAKey.generate(), paramiko.ECDSAKey.generate()


def policy(tmp_path: Path, **config: str) -> hostkeys.HostKeyPolicy:
    config.setdefault("userknownhostsfile", f'"{tmp_path}/known hosts"')
    config.setdefault("globalknownhostsfile", "none")
    return hostkeys.resolve("node2", config, hostname="10.0.0.2", port=22)


@pytest.mark.parametrize(
    ("value", "strictness"),
    [
        (None, STRICT),  # OpenSSH's default is ask, and there is no one to ask
        ("yes", STRICT),
        ("ask", STRICT),
        ("Accept-New", ACCEPT_NEW),
        ("no", OFF),
        ("off", OFF),
        ("maybe", STRICT),  # a value we do not know: the safe reading
    ],
)
def test_strict_host_key_checking_values(tmp_path: Path, value: str | None, strictness: str):
    config = {} if value is None else {"stricthostkeychecking": value}
    assert policy(tmp_path, **config).strictness == strictness


def test_the_opt_out_flag_beats_the_ssh_config(tmp_path: Path):
    p = hostkeys.resolve(
        "node2", {"stricthostkeychecking": "yes"}, hostname="n", port=22, check=False
    )
    assert p.strictness == OFF and hostkeys.SKIP_FLAG in p.reason


def test_lookup_name_and_files(tmp_path: Path):
    assert policy(tmp_path).name == "10.0.0.2"  # the resolved HostName, as OpenSSH
    assert hostkeys.resolve("n", {}, hostname="h", port=2222).name == "[h]:2222"
    assert policy(tmp_path, hostkeyalias="bastion-b").name == "bastion-b"
    assert policy(tmp_path).user_files == (tmp_path / "known hosts",)  # quoted, with a space
    assert policy(tmp_path).global_files == ()  # none
    defaults = hostkeys.resolve("n", {}, hostname="h", port=22)
    assert defaults.user_files[0] == Path("~/.ssh/known_hosts").expanduser()
    assert defaults.global_files[0] == Path("/etc/ssh/ssh_known_hosts")
    two = policy(tmp_path, userknownhostsfile=f"{tmp_path}/a %d/b")
    assert two.user_files == (tmp_path / "a", Path("~").expanduser() / "b")
    # paramiko hands `UserKnownHostsFile "/x/a b/kh"` over without its quotes
    (tmp_path / "a b").mkdir()
    unquoted = policy(tmp_path, userknownhostsfile=f"{tmp_path}/a b/kh")
    assert unquoted.user_files == (tmp_path / "a b" / "kh",)
    parsed = paramiko.SSHConfig.from_text(
        f'Host node2\n    UserKnownHostsFile "{tmp_path}/a b/kh"\n'
    ).lookup("node2")
    assert policy(tmp_path, **parsed).user_files == (tmp_path / "a b" / "kh",)


@pytest.mark.parametrize("hashed", [False, True])
@pytest.mark.parametrize("port", [22, 2222])
def test_known_keys_plain_hashed_and_port_entries(tmp_path: Path, keys, hashed: bool, port: int):
    good, other = keys
    p = hostkeys.resolve(
        "node2",
        {"userknownhostsfile": str(tmp_path / "kh"), "globalknownhostsfile": "none"},
        hostname="10.0.0.2",
        port=port,
    )
    hostkeys.add_known(tmp_path / "kh", "10.0.0.3", other, hashed=hashed)  # another host
    assert p.known_keys() == {}
    hostkeys.add_known(tmp_path / "kh", p.name, good, hashed=hashed)
    assert p.known_keys() == {good.get_name(): good}
    text = (tmp_path / "kh").read_text()
    assert ("10.0.0.2" in text) is not hashed
    assert (tmp_path / "kh").stat().st_mode & 0o777 == 0o600


def test_the_global_file_counts_and_a_missing_file_is_no_error(tmp_path: Path, keys):
    good, _ = keys
    hostkeys.add_known(tmp_path / "global", "10.0.0.2", good, hashed=False)
    p = hostkeys.resolve(
        "node2",
        {
            "userknownhostsfile": str(tmp_path / "absent"),
            "globalknownhostsfile": str(tmp_path / "global"),
        },
        hostname="10.0.0.2",
        port=22,
    )
    assert p.known_keys() == {good.get_name(): good}


def test_an_unknown_key_is_refused_with_its_fingerprint_and_the_fix(tmp_path: Path, keys):
    good, _ = keys
    client = paramiko.SSHClient()
    p = policy(tmp_path)
    hostkeys.install(client, p, hostname="10.0.0.2", port=22)
    with pytest.raises(HostKeyError) as caught:
        client._policy.missing_host_key(client, "10.0.0.2", good)
    e = caught.value
    assert isinstance(e, HostUnreachable) and not e.changed
    assert e.message.startswith("cannot reach node2 over ssh: its SSH host key is not known (")
    assert f"ecdsa {good.fingerprint}" in e.message and good.fingerprint.startswith("SHA256:")
    assert "ssh-keyscan -H 10.0.0.2 >>" in e.message and hostkeys.SKIP_FLAG in e.message
    assert not (tmp_path / "known hosts").exists()  # nothing written


def test_accept_new_adds_the_key_then_it_is_known(tmp_path: Path, keys):
    good, _ = keys
    p = policy(tmp_path, stricthostkeychecking="accept-new", hashknownhosts="yes")
    client = paramiko.SSHClient()
    hostkeys.install(client, p, hostname="10.0.0.2", port=22)
    client._policy.missing_host_key(client, "10.0.0.2", good)  # no error: added
    assert p.known_keys() == {good.get_name(): good}
    assert (tmp_path / "known hosts").read_text().startswith("|1|")  # HashKnownHosts yes


def test_known_keys_go_where_paramiko_looks_so_a_changed_key_is_refused(tmp_path: Path, keys):
    good, other = keys
    hostkeys.add_known(tmp_path / "known hosts", "[10.0.0.2]:2200", good, hashed=True)
    p = hostkeys.resolve(
        "node2",
        {"userknownhostsfile": f'"{tmp_path}/known hosts"', "stricthostkeychecking": "accept-new"},
        hostname="10.0.0.2",
        port=2200,
    )
    client = paramiko.SSHClient()
    hostkeys.install(client, p, hostname="10.0.0.2", port=2200)
    # paramiko's own lookup in connect(): found, so a different key is its BadHostKeyException
    assert client.get_host_keys().lookup("[10.0.0.2]:2200")[good.get_name()] == good
    e = hostkeys.bad_key_error(p, paramiko.BadHostKeyException("10.0.0.2", other, good))
    assert e.changed and "its SSH host key CHANGED" in e.message
    assert "man-in-the-middle" in e.message and other.fingerprint in e.message
    assert f"ssh-keygen -R '[10.0.0.2]:2200' -f '{tmp_path}/known hosts'" in e.message


def test_an_alias_is_looked_up_under_its_own_name(tmp_path: Path, keys):
    good, _ = keys
    hostkeys.add_known(tmp_path / "known hosts", "bastion-b", good, hashed=False)
    p = policy(tmp_path, hostkeyalias="bastion-b")
    client = paramiko.SSHClient()
    hostkeys.install(client, p, hostname="10.0.0.2", port=22)
    assert client.get_host_keys().lookup("10.0.0.2") == {good.get_name(): good}


def test_off_accepts_any_key_and_says_so_once(tmp_path: Path, keys, caplog):
    good, _ = keys
    hostkeys._warned.clear()
    caplog.set_level("WARNING", logger="ftrun.transport")
    for _ in range(2):
        client = paramiko.SSHClient()
        hostkeys.install(
            client, policy(tmp_path, stricthostkeychecking="no"), hostname="10.0.0.2", port=22
        )
        client._policy.missing_host_key(client, "10.0.0.2", good)
    warnings = [r.message for r in caplog.records if "NOT checked" in r.message]
    assert len(warnings) == 1 and "StrictHostKeyChecking no" in warnings[0]
