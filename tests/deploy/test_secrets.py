"""NATS secrets reach the services only as files mounted from a Secret (or secretKeyRef), never
as a command-line argument, a plain environment value or ConfigMap data."""

from __future__ import annotations

import base64
import re
from pathlib import PurePosixPath

import pytest

from tests.deploy.chart import (
    Container,
    Object,
    component,
    containers,
    of_kind,
    option_values,
    render,
)
from tests.deploy.variants import CREDS, NKEY_SEED, PASSWORD, TOKEN, VARIANTS

SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SEED|CREDS|SECRET|KEY", re.IGNORECASE)
# Settings that name a file holding a secret (or a private key), and whether others may read it.
SECRET_FILE_OPTIONS = {
    "--nats-password-file": False,
    "--nats-token-file": False,
    "--nats-nkey-seed-file": False,
    "--nats-creds-file": False,
    "--nats-tls-key-file": False,
    "--nats-tls-cert-file": False,
    "--nats-tls-ca-file": True,
}


def secret_values(objects: tuple[Object, ...]) -> set[str]:
    """The values of every rendered Secret but user names (not secret, and short)."""
    values: set[str] = set()
    for secret in of_kind(objects, "Secret"):
        plain = dict(secret.get("stringData", {}))
        plain |= {k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()}
        values |= {value for key, value in plain.items() if key != "user"}
    return values


def test_chart_created_secrets_hold_the_credentials() -> None:
    """The variants below do render secrets, so the leak checks have something to look for."""
    found = set()
    for variant in VARIANTS:
        found |= secret_values(render(VARIANTS[variant]))
    assert {PASSWORD, TOKEN, NKEY_SEED} <= found
    assert CREDS not in found  # that variant uses an existing Secret


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_no_secret_in_arguments_plain_env_or_config_maps(variant: str) -> None:
    objects = render(VARIANTS[variant])
    secrets = secret_values(objects)
    for container in containers(objects):
        words = [*container.args(), *container.spec.get("command", [])]
        for entry in container.env():
            if "value" in entry:
                assert not SECRET_NAME.search(entry["name"]), f"{container.where}: {entry['name']}"
                words.append(entry["value"])
        for secret in secrets:
            assert not [w for w in words if secret in w], f"{container.where} carries a secret"
    for config_map in of_kind(objects, "ConfigMap"):
        text = str(config_map.get("data", {}))
        assert not [s for s in secrets if s in text], config_map["metadata"]["name"]


def _mounted_secret_key(container: Container, path: str) -> tuple[Object, str]:
    """The Secret volume and key the file ``path`` comes from in ``container``."""
    file = PurePosixPath(path)
    (mount,) = [
        m for m in container.spec["volumeMounts"] if PurePosixPath(m["mountPath"]) == file.parent
    ]
    volume = container.volume(mount["name"])
    assert "secret" in volume, f"{container.where}: {path} is not from a Secret"
    (item,) = [i for i in volume["secret"]["items"] if i["path"] == file.name]
    return volume["secret"], item["key"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_secret_files_the_services_are_told_to_read_are_mounted_from_secrets(variant: str) -> None:
    objects = render(VARIANTS[variant])
    for container in containers(objects):
        for option, path in option_values(container.args() or ["-"]).items():
            if option not in SECRET_FILE_OPTIONS:
                continue
            secret, _key = _mounted_secret_key(container, path)
            world_readable = bool(secret["defaultMode"] & 0o004)
            assert world_readable == SECRET_FILE_OPTIONS[option], f"{container.where}: {option}"


def test_credential_files_come_from_the_configured_secret_and_keys() -> None:
    cases = {
        "clustered-nats-user-password": (
            "--nats-password-file",
            component("nats-auth"),
            "password",
        ),
        "embedded-nats-tls-token": ("--nats-token-file", component("nats-auth"), "token"),
        "external-nats-nkey": ("--nats-nkey-seed-file", component("nats-auth"), "nkey.seed"),
        "external-nats-tls-creds": ("--nats-creds-file", "tessera-nats-creds", "nats.creds"),
    }
    for variant, (option, secret_name, key) in cases.items():
        objects = render(VARIANTS[variant])
        tessera = [c for c in containers(objects) if c.args() and c.args()[0] != "-"]
        # The webhook too: it reads the inventories (the cluster's GPUs).
        assert len([c for c in tessera if option in option_values(c.args())]) == 6, variant
        for container in tessera:
            secret, found_key = _mounted_secret_key(
                container, option_values(container.args())[option]
            )
            assert (secret["secretName"], found_key) == (secret_name, key), container.where


def test_user_name_comes_from_the_secret_by_reference() -> None:
    objects = render(VARIANTS["clustered-nats-user-password"])
    for container in containers(objects):
        if not container.args() or container.init:
            continue
        (user,) = [e for e in container.env() if e["name"] == "TESSERA_NATS_USER"]
        assert user["valueFrom"] == {
            "secretKeyRef": {"name": component("nats-auth"), "key": "user"}
        }


def test_an_existing_secret_is_used_and_none_is_rendered() -> None:
    objects = render(
        {
            "nats": {
                "auth": {
                    "type": "user-password",
                    "existingSecret": "my-nats",
                    "secretKeys": {"user": "username", "password": "pass"},
                }
            }
        }
    )
    # The only Secret rendered is the webhook's serving certificate, no NATS credential.
    assert [s["metadata"]["name"] for s in of_kind(objects, "Secret")] == [component("webhook-tls")]
    (placer,) = [c for c in containers(objects) if c.spec["name"] == "placer"]
    secret, key = _mounted_secret_key(placer, option_values(placer.args())["--nats-password-file"])
    assert (secret["secretName"], key) == ("my-nats", "pass")
    (user,) = [e for e in placer.env() if e["name"] == "TESSERA_NATS_USER"]
    assert user["valueFrom"]["secretKeyRef"] == {"name": "my-nats", "key": "username"}
