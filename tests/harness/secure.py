"""Secrets for secured nats-server tests, all made here: a CA with server and client certificates,
NKey pairs, and an operator/account/user JWT chain with its ``.creds`` file.

Nothing is downloaded: certificates come from ``cryptography`` (a dev dependency), keys and JWT
signatures from ``nkeys`` (what nats-py itself uses). The JWTs follow the NATS v2 claim format
(``typ: JWT, alg: ed25519-nkey``), which nats-server verifies in operator mode.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

SERVER_NAME = "nats.tessera.test"
"""The only name in the server certificate (no IP address): connecting to 127.0.0.1 needs
``--nats-tls-server-name`` to verify it."""


@dataclass(frozen=True)
class Certificates:
    """PEM files: a CA, a server certificate for :data:`SERVER_NAME`, a client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name | None,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    elif server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(SERVER_NAME)]), critical=False
        ).add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
    else:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def make_certificates(directory: Path) -> Certificates:
    """A fresh CA and the server and client certificates it signed, written to ``directory``."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _certificate("tessera test CA", ca_key, None, ca_key, ca=True)
    files: dict[str, bytes] = {"ca.pem": ca_cert.public_bytes(serialization.Encoding.PEM)}
    for role in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _certificate(
            SERVER_NAME if role == "server" else "tessera-client",
            key,
            ca_cert.subject,
            ca_key,
            server=role == "server",
        )
        files[f"{role}.pem"] = cert.public_bytes(serialization.Encoding.PEM)
        files[f"{role}-key.pem"] = _key_pem(key)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return Certificates(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server-key.pem",
        client_cert=directory / "client.pem",
        client_key=directory / "client-key.pem",
    )


def tls_config(certs: Certificates, *, verify_clients: bool) -> str:
    """The nats-server ``tls {}`` block for ``certs``."""
    verify = "\n  verify: true" if verify_clients else ""
    return (
        f'tls {{\n  cert_file: "{certs.server_cert}"\n  key_file: "{certs.server_key}"\n'
        f'  ca_file: "{certs.ca}"{verify}\n}}\n'
    )


# --- NKeys and JWTs --------------------------------------------------------------------------


def new_nkey(prefix: int) -> tuple[bytes, str]:
    """(seed, public key) of a fresh NKey of kind ``prefix`` (nkeys.PREFIX_BYTE_USER, ...)."""
    seed = nkeys.encode_seed(os.urandom(32), prefix)
    return seed, nkeys.from_seed(bytearray(seed)).public_key.decode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _jwt(claims: dict[str, Any], signer_seed: bytes) -> str:
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = dict(claims, iat=int(time.time()))
    digest = hashlib.new("sha512_256", json.dumps(body, sort_keys=True).encode()).digest()
    body["jti"] = base64.b32encode(digest).decode().rstrip("=")
    payload = _b64(json.dumps(body).encode())
    signature = nkeys.from_seed(bytearray(signer_seed)).sign(f"{header}.{payload}".encode())
    return f"{header}.{payload}.{_b64(signature)}"


@dataclass(frozen=True)
class OperatorMode:
    """A server configuration in operator mode and the ``.creds`` text of one user in it."""

    server_config: str
    creds: str


def operator_mode(
    *, user_expires_at: float | None = None, user_permissions: dict[str, Any] | None = None
) -> OperatorMode:
    """Operator -> account (JetStream enabled) -> user, with a memory resolver and the system
    account JetStream needs; the user's JWT expires at ``user_expires_at`` when given, and
    carries ``user_permissions`` (its ``pub``, ``sub`` and ``resp`` claims) when given."""
    operator_seed, operator = new_nkey(nkeys.PREFIX_BYTE_OPERATOR)
    account_seed, account = new_nkey(nkeys.PREFIX_BYTE_ACCOUNT)
    user_seed, user = new_nkey(nkeys.PREFIX_BYTE_USER)
    _, system = new_nkey(nkeys.PREFIX_BYTE_ACCOUNT)
    unlimited = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1}
    operator_jwt = _jwt(
        {
            "iss": operator,
            "sub": operator,
            "name": "tessera-test",
            "nats": {"type": "operator", "version": 2},
        },
        operator_seed,
    )
    account_jwt = _jwt(
        {
            "iss": operator,
            "sub": account,
            "name": "tessera",
            "nats": {
                "type": "account",
                "version": 2,
                "limits": unlimited
                | {
                    "wildcards": True,
                    "conn": -1,
                    "leaf": -1,
                    "mem_storage": -1,
                    "disk_storage": -1,
                    "streams": -1,
                    "consumer": -1,
                },
            },
        },
        operator_seed,
    )
    user_claims: dict[str, Any] = {
        "iss": account,
        "sub": user,
        "name": "tessera-service",
        "nats": {"type": "user", "version": 2, "pub": {}, "sub": {}}
        | unlimited
        | (user_permissions or {}),
    }
    if user_expires_at is not None:
        user_claims["exp"] = int(user_expires_at)
    user_jwt = _jwt(user_claims, account_seed)
    system_jwt = _jwt(
        {
            "iss": operator,
            "sub": system,
            "name": "SYS",
            "nats": {"type": "account", "version": 2, "limits": unlimited},
        },
        operator_seed,
    )
    config = (
        f"operator: {operator_jwt}\n"
        f"system_account: {system}\n"
        "resolver: MEMORY\n"
        f"resolver_preload: {{\n  {account}: {account_jwt}\n  {system}: {system_jwt}\n}}\n"
    )
    creds = (
        "-----BEGIN NATS USER JWT-----\n"
        f"{user_jwt}\n"
        "------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{user_seed.decode()}\n"
        "------END USER NKEY SEED------\n"
    )
    return OperatorMode(server_config=config, creds=creds)
