"""A throwaway CA and serving certificate: for the admission webhook ``tessera up`` runs, and
for the API test double when it serves HTTPS.

The API server calls webhooks over HTTPS and verifies the serving certificate against the
configuration's ``caBundle``; on a cluster the chart's certificate (cert-manager's, or one helm
generates) plays this part. kubectl sends credentials (a bearer token) only over HTTPS, so the
API test double serves HTTPS when clients must say who they are. Keys never leave the directory
they are written to.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class ServingCertificate:
    """PEM files of a serving certificate and key, and the CA certificate that signed it."""

    ca_pem: bytes
    cert_file: Path
    key_file: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _alternative_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_serving_certificate(
    directory: Path, hosts: Sequence[str], *, days: int = 30, ca_name: str = "tessera-webhook-ca"
) -> ServingCertificate:
    """A new CA and a certificate it signs for ``hosts`` (DNS names or IP addresses), written
    to ``directory`` (``ca.crt``, ``tls.crt``, ``tls.key``, the key readable by its owner only)."""
    now = datetime.datetime.now(datetime.UTC)
    valid_from, valid_until = (
        now - datetime.timedelta(minutes=5),
        now + datetime.timedelta(days=days),
    )
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name(ca_name))
        .issuer_name(_name(ca_name))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid_from)
        .not_valid_after(valid_until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    serving = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid_from)
        .not_valid_after(valid_until)
        .add_extension(
            x509.SubjectAlternativeName([_alternative_name(h) for h in hosts]), critical=False
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    (directory / "ca.crt").write_bytes(ca_pem)
    cert_file = directory / "tls.crt"
    cert_file.write_bytes(serving.public_bytes(serialization.Encoding.PEM))
    key_file = directory / "tls.key"
    key_file.touch(mode=0o600)
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ServingCertificate(ca_pem=ca_pem, cert_file=cert_file, key_file=key_file)
