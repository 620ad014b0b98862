"""TLS for the control plane between hosts: one throwaway certificate per controller, pinned.

The HMAC keys of protocol.py prove who sent a frame; they do not hide it, and what agents send
includes the ranks' output (training data, prompts, tracebacks). So when agents run on other
hosts, the controller wraps every connection in TLS 1.3 with a certificate it makes at start-up
and never writes anywhere but (briefly, 0600) its own job directory. Agents learn the
certificate from their bootstrap, which reaches them over the SSH connection or srun that
started them; they trust that certificate and nothing else, so no CA, no setup, no host names.
`ftrun chaos`/`ftrun hosts` find it in control.json (0600) beside the secret.

Loopback stays plain (the local transport): only root sees loopback traffic, and root on the
host sees the job anyway. docs/security.md has the reasoning, and why not SSH port forwarding.

The certificate is made with `cryptography`, which paramiko (hence the ssh transport) already
requires; the agent side needs only the standard library's ssl.
"""

from __future__ import annotations

import datetime
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

# Long enough for any job; the key dies with the controller anyway.
VALID_FOR = datetime.timedelta(days=3650)


@dataclass(frozen=True)
class Identity:
    cert_pem: str
    key_pem: str


def new_identity() -> Identity:
    """A fresh ECDSA P-256 key and a self-signed certificate for it (its own trust anchor)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ftrun controller")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # clocks of other hosts differ
        .not_valid_after(now + VALID_FOR)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    return Identity(
        cert_pem=cert.public_bytes(serialization.Encoding.PEM).decode(),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode(),
    )


def server_context(identity: Identity, scratch_dir: Path) -> ssl.SSLContext:
    """The controller's context. ssl loads a key only from a file: it is written 0600 into
    `scratch_dir` (the job's own directory), loaded, and removed at once."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    fd, path = tempfile.mkstemp(prefix=".tls-", dir=scratch_dir)  # mkstemp: 0600, O_EXCL
    try:
        os.write(fd, (identity.key_pem + identity.cert_pem).encode())
        os.close(fd)
        ctx.load_cert_chain(path)
    finally:
        os.unlink(path)
    return ctx


def client_context(cert_pem: str) -> ssl.SSLContext:
    """An agent's (or client's) context: the controller's certificate is the only one trusted.
    No host name check: the pin is the check, and agents dial addresses, not names."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata=cert_pem)
    return ctx
