"""The real kubectl against the API test double: what it sends is understood, and what it is
answered it prints as it does against a kube-apiserver."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tessera.devcluster.apiserver import ApiServer
from tests.harness.nats import environment_without_proxies

KUBECTL = Path(sys.executable).parent / "kubectl"


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


async def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> Ran:
    """Run the real kubectl without blocking the loop the API double answers on."""
    process = await asyncio.create_subprocess_exec(
        str(KUBECTL), "--kubeconfig", str(kubeconfig), *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=environment_without_proxies(),
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(stdin.encode() if stdin else None), 60)
    assert process.returncode is not None
    return Ran(process.returncode, out.decode(), err.decode())


@pytest.fixture
async def plain(tmp_path: Path) -> AsyncIterator[tuple[ApiServer, Path]]:
    """The double over plain http (kubectl sends no token there) and a kubeconfig for it."""
    async with ApiServer(token="") as api:
        yield api, api.write_kubeconfig(tmp_path / "kubeconfig")


def negative_cores(name: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "containers": [
                    {"name": "c", "image": "busybox", "resources": {"limits": {"cpu": "-1"}}}
                ]
            },
        }
    )


async def test_an_invalid_object_is_answered_with_its_causes_and_kubectl_prints_them(
    plain: tuple[ApiServer, Path],
) -> None:
    _, kubeconfig = plain
    refused = await kubectl(kubeconfig, "apply", "-f", "-", stdin=negative_cores("negcores"))
    assert refused.returncode != 0
    lines = refused.stderr.splitlines()
    assert lines[0].startswith('The Pod "negcores" is invalid'), refused.stderr
    for section in ("limits", "requests"):  # requests are defaulted from the limits
        assert (
            f"* spec.containers[0].resources.{section}[cpu]: Invalid value: '-1': must be greater "
            "than or equal to 0"
        ) in lines, refused.stderr


async def test_the_422_status_carries_causes_as_the_api_server_writes_them(
    plain: tuple[ApiServer, Path],
) -> None:
    _, kubeconfig = plain
    shown = await kubectl(kubeconfig, "create", "-f", "-", "-v=8", stdin=negative_cores("negcores"))
    # Match on the decoded body: a "422" can as well be part of a log line's timestamp, and
    # kubectl truncates long bodies (discovery documents) so those do not decode at all.
    status: dict[str, Any] = next(
        body
        for body in (
            _response_body(line) for line in shown.stderr.splitlines() if '"Response Body"' in line
        )
        if body.get("kind") == "Status"
    )
    assert status["code"] == 422 and status["reason"] == "Invalid"
    assert status["details"]["kind"] == "Pod" and status["details"]["name"] == "negcores"
    causes = status["details"]["causes"]
    assert [cause["field"] for cause in causes] == [
        "spec.containers[0].resources.limits[cpu]",
        "spec.containers[0].resources.requests[cpu]",
    ]
    for cause in causes:
        assert cause["reason"] == "FieldValueInvalid"
        assert cause["message"] == "Invalid value: '-1': must be greater than or equal to 0"


async def test_kubectl_create_namespace_and_secret_as_the_readme_writes_them(
    plain: tuple[ApiServer, Path], tmp_path: Path
) -> None:
    """kubectl's create generators send protobuf; the README creates a namespace and a secret
    generic from a file."""
    _, kubeconfig = plain
    created = await kubectl(kubeconfig, "create", "namespace", "tessera-system")
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip() == "namespace/tessera-system created"
    namespace = json.loads(
        (await kubectl(kubeconfig, "get", "namespace", "tessera-system", "-o", "json")).stdout
    )
    assert namespace["status"]["phase"] == "Active"
    assert namespace["metadata"]["labels"]["kubernetes.io/metadata.name"] == "tessera-system"
    again = await kubectl(kubeconfig, "create", "namespace", "tessera-system")
    assert again.returncode != 0 and "AlreadyExists" in again.stderr

    creds = tmp_path / "tessera.creds"
    creds.write_bytes(b"-----BEGIN NATS USER JWT-----\nabc\n\x00\xff")
    secret = await kubectl(
        kubeconfig, "-n", "tessera-system", "create", "secret", "generic", "tessera-nats",
        f"--from-file=nats.creds={creds}", "--from-literal=user=tessera",
    )  # fmt: skip
    assert secret.returncode == 0, secret.stderr
    assert secret.stdout.strip() == "secret/tessera-nats created"
    stored = json.loads(
        (
            await kubectl(
                kubeconfig, "-n", "tessera-system", "get", "secret", "tessera-nats", "-o", "json"
            )
        ).stdout
    )
    assert stored["type"] == "Opaque"
    assert base64.b64decode(stored["data"]["nats.creds"]) == creds.read_bytes()
    assert base64.b64decode(stored["data"]["user"]) == b"tessera"


async def test_a_protobuf_body_of_a_kind_the_double_cannot_read_is_refused_clearly(
    plain: tuple[ApiServer, Path],
) -> None:
    _, kubeconfig = plain
    refused = await kubectl(kubeconfig, "create", "serviceaccount", "robot")
    assert refused.returncode != 0
    assert "protobuf" in refused.stderr and "ServiceAccount" in refused.stderr, refused.stderr


def _response_body(line: str) -> dict[str, Any]:
    """The JSON body kubectl -v=8 logged on `line`, or {} where it was truncated or not JSON."""
    try:
        decoded = json.loads(json.loads(line.split("body=", 1)[1]))
    except (IndexError, ValueError):
        return {}
    return decoded if isinstance(decoded, dict) else {}
