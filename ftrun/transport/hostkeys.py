"""Host-key checking for the ssh transport: which key a host may present, decided as OpenSSH does.

The job secret goes to the agent on the ssh session's stdin, so the session must be with the host
we meant: a machine that answers on the host's address with another key would get the secret and
the job. Fabric leaves paramiko accepting any key; this module puts the user's own trust back:

- the keys in the known_hosts files ssh would read (`UserKnownHostsFile`, default
  ~/.ssh/known_hosts; `GlobalKnownHostsFile`, default /etc/ssh/ssh_known_hosts), plain or hashed
  (`|1|...`), `[host]:port` off port 22, looked up under `HostKeyAlias` when set, else the
  resolved `HostName`;
- `StrictHostKeyChecking` from the ssh config: `yes` or `ask` (there is no one to ask) refuse an
  unknown key, `accept-new` adds it to the user's known_hosts, `no`/`off` accept any key (said
  once in the log). A key that differs from the known one is refused unless checking is off;
- `--insecure-skip-host-key-check` turns checking off for the whole launch (said once too).

`resolve` reads the per-host ssh config into a `HostKeyPolicy` (pure), `install` arms a paramiko
client with it before the connection opens; a refusal is a `HostKeyError`, which is a
`HostUnreachable`, so launch reports it per host like any other host it could not start.
"""

from __future__ import annotations

import getpass
import logging
import os
import shlex
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftrun.errors import HostUnreachable

log = logging.getLogger("ftrun.transport")

SKIP_FLAG = "--insecure-skip-host-key-check"
DEFAULT_USER_FILES = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
DEFAULT_GLOBAL_FILES = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
STRICT = "yes"  # refuse unknown and changed keys
ACCEPT_NEW = "accept-new"  # add unknown keys to the user's known_hosts, refuse changed ones
OFF = "no"  # accept any key
_STRICTNESS = {"yes": STRICT, "ask": STRICT, "accept-new": ACCEPT_NEW, "no": OFF, "off": OFF}

_warned: set[str] = set()
_append_lock = threading.Lock()  # hosts connect in parallel threads: one append at a time


class HostKeyError(HostUnreachable):
    """The host presented a key we do not trust: unknown, or different from the known one."""

    def __init__(self, host: str, error: str, *, hint: str, changed: bool) -> None:
        super().__init__(host, error, via="over ssh", hint=hint)
        self.changed = changed


@dataclass(frozen=True)
class HostKeyPolicy:
    """What one host's key is checked against (from its ssh config and the launch's flag)."""

    host: str  # as the user wrote it (--hosts): named in messages
    name: str  # looked up in known_hosts: HostKeyAlias, or HostName ("[HostName]:port" off 22)
    hostname: str  # where the connection goes (HostName) and its port: for ssh-keyscan
    port: int
    strictness: str  # STRICT, ACCEPT_NEW or OFF
    user_files: tuple[Path, ...]
    global_files: tuple[Path, ...]
    hash_new: bool = False  # HashKnownHosts: a key accept-new adds is written hashed
    reason: str = ""  # why checking is OFF, for the log

    def known_keys(self) -> dict[str, Any]:
        """Key type → key known for `name`, from every file that exists (user files first)."""
        import paramiko

        keys = paramiko.HostKeys()
        for path in (*self.global_files, *self.user_files):  # later files win on a clash
            try:
                keys.load(str(path))
            except OSError:
                continue  # absent or unreadable, as ssh treats it
        found = keys.lookup(self.name)
        return dict(found) if found is not None else {}


def resolve(
    host: str,
    ssh_config: Mapping[str, Any],
    *,
    hostname: str,
    port: int,
    user: str | None = None,
    check: bool = True,
) -> HostKeyPolicy:
    """The policy for one host, from its ssh config (fabric's per-host lookup, keys lowercase)."""
    alias = ssh_config.get("hostkeyalias")
    name = alias if alias else (hostname if port == 22 else f"[{hostname}]:{port}")
    user_files = _files(ssh_config.get("userknownhostsfile"), DEFAULT_USER_FILES, user, hostname)
    global_files = _files(
        ssh_config.get("globalknownhostsfile"), DEFAULT_GLOBAL_FILES, user, hostname
    )
    hash_new = str(ssh_config.get("hashknownhosts", "no")).lower() == "yes"
    if not check:
        return HostKeyPolicy(
            host,
            name,
            hostname,
            port,
            OFF,
            user_files,
            global_files,
            hash_new,
            reason=f"{SKIP_FLAG} was given",
        )
    value = str(ssh_config.get("stricthostkeychecking", "yes")).lower()
    strictness = _STRICTNESS.get(value, STRICT)  # an unknown value: the safe reading
    reason = f"the ssh config says StrictHostKeyChecking {value}" if strictness == OFF else ""
    return HostKeyPolicy(
        host, name, hostname, port, strictness, user_files, global_files, hash_new, reason
    )


def _files(
    value: object, default: tuple[str, ...], user: str | None, hostname: str
) -> tuple[Path, ...]:
    """A *KnownHostsFile value: whitespace-separated, maybe quoted, `none` for no file."""
    words = _words(str(value)) if value else list(default)
    home = str(Path("~").expanduser())
    local_user = getpass.getuser()
    out = []
    for word in words:
        if word.lower() == "none":
            continue
        word = (
            word.replace("%%", "\0")
            .replace("%d", home)
            .replace("%u", local_user)
            .replace("%r", user or local_user)
            .replace("%h", hostname)
            .replace("\0", "%")
        )
        out.append(Path(word).expanduser())
    return tuple(out)


def _words(text: str) -> list[str]:
    """paramiko drops the quotes around a value that is one quoted string, so `"/a b/kh"`
    arrives as `/a b/kh`: a value without quotes whose whole text is a path in an existing
    directory is that one path; else the words, as ssh splits them."""
    if '"' not in text and Path(text).expanduser().parent.is_dir():
        return [text]
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def describe(key: Any) -> str:
    """`ed25519 SHA256:…`, as ssh shows a key."""
    kind = key.get_name().removeprefix("ssh-").removesuffix("-cert-v01@openssh.com")
    kind = "ecdsa" if kind.startswith("ecdsa") else "rsa" if kind.startswith("rsa") else kind
    return f"{kind} {key.fingerprint}"


def _user_file(policy: HostKeyPolicy) -> str:
    """The known_hosts file ssh writes to, as a person would type it."""
    first = policy.user_files[0] if policy.user_files else Path("~/.ssh/known_hosts").expanduser()
    home = str(Path("~").expanduser())
    text = str(first)
    return shlex.quote(text) if not text.startswith(home + "/") else "~" + text[len(home) :]


def unknown_key(policy: HostKeyPolicy, key: Any) -> HostKeyError:
    host = policy.host
    first = _user_file(policy)
    port = f"-p {policy.port} " if policy.port != 22 else ""
    return HostKeyError(
        host,
        f"its SSH host key is not known ({describe(key)}); after checking that fingerprint "
        f"with the host's owner, add it with `ssh-keyscan -H {port}{policy.hostname} >> "
        f"{first}` (or run `ssh {host}` once), or pass {SKIP_FLAG} to accept any key "
        "(insecure)",
        hint=f"add {host}'s host key to {first}, or pass {SKIP_FLAG}",
        changed=False,
    )


def changed_key(policy: HostKeyPolicy, key: Any, known: Any) -> HostKeyError:
    host = policy.host
    first = _user_file(policy)
    in_file = "" if first == "~/.ssh/known_hosts" else f" -f {first}"
    remove = f"ssh-keygen -R {shlex.quote(policy.name)}{in_file}"
    return HostKeyError(
        host,
        f"its SSH host key CHANGED: it presented {describe(key)} where {describe(known)} is "
        f"known: possible man-in-the-middle attack, nothing was sent to it; if the host was "
        f"reinstalled, remove the old key with `{remove}` and add the new one",
        hint=f"verify {host}'s new key, then `{remove}`",
        changed=True,
    )


def install(client: Any, policy: HostKeyPolicy, *, hostname: str, port: int) -> None:
    """Arm a paramiko SSHClient (before connect) to check the host's key against `policy`.

    The known keys go into the client under the name paramiko looks up (so it prefers their type
    and refuses a changed key itself, as BadHostKeyException); an unknown key reaches our
    MissingHostKeyPolicy, which refuses it, adds it (accept-new) or lets it pass (off)."""

    if policy.strictness == OFF:
        # No known keys loaded, so no key is "changed" either: every key reaches _Missing.
        _warn_once(policy.reason, f"ssh host keys are NOT checked: {policy.reason}")
        client.set_missing_host_key_policy(_Missing(policy))
        return
    paramiko_name = hostname if port == 22 else f"[{hostname}]:{port}"
    client_keys = client.get_host_keys()
    for kind, key in policy.known_keys().items():
        client_keys.add(paramiko_name, kind, key)
    client.set_missing_host_key_policy(_Missing(policy))


def bad_key_error(policy: HostKeyPolicy, e: Any) -> HostKeyError:
    """paramiko's BadHostKeyException as our changed-key error."""
    return changed_key(policy, e.key, e.expected_key)


class _Missing:
    """paramiko's MissingHostKeyPolicy for a host none of whose keys is known (or for every
    host when checking is off)."""

    def __init__(self, policy: HostKeyPolicy) -> None:
        self.policy = policy

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        if self.policy.strictness == OFF:
            return
        if self.policy.strictness != ACCEPT_NEW or not self.policy.user_files:
            raise unknown_key(self.policy, key)
        path = self.policy.user_files[0]
        add_known(path, self.policy.name, key, hashed=self.policy.hash_new)
        log.warning(
            "%s: added its host key %s to %s (StrictHostKeyChecking accept-new)",
            self.policy.host,
            describe(key),
            path,
        )


def add_known(path: Path, name: str, key: Any, *, hashed: bool) -> None:
    """Append one known_hosts line (0600 file, 0700 directory when we create them)."""
    import paramiko

    names = [paramiko.HostKeys.hash_host(name) if hashed else name]
    line = paramiko.hostkeys.HostKeyEntry(names, key).to_line()
    with _append_lock:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(line)


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning("%s", message)
