"""``tessera webhook`` as a real process over real TLS: reviews answered, bad input refused with a
reason, the certificate rotated without a restart, health and metrics on the HTTP port."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography import x509

from tessera.devcluster.apiserver import ApiServer, User, service_account
from tessera.devcluster.certs import ServingCertificate, make_serving_certificate
from tessera.devcluster.resources import POD
from tessera.up.system import register_webhook
from tests.binder.builders import container, pod
from tests.devcluster.test_kubectl import kubectl
from tests.harness.nats import environment_without_proxies
from tests.webhook.test_admission import review_body

ROOT = Path(__file__).resolve().parents[2]


class Webhook:
    def __init__(self, process: subprocess.Popen[bytes], log: Path, certs: ServingCertificate):
        self.process, self.log, self.certs = process, log, certs
        self.http_port = self.tls_port = 0

    def wait_started(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()
            for line in self.log.read_text().splitlines():
                if line.startswith("{") and json.loads(line).get("msg") == "service starting":
                    entry = json.loads(line)
                    self.http_port, self.tls_port = entry["http_port"], entry["tls_port"]
                    return
            time.sleep(0.05)
        raise AssertionError(f"no 'service starting' line:\n{self.log.read_text()}")

    def client_context(self, ca_pem: bytes | None = None) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=(ca_pem or self.certs.ca_pem).decode())


def start(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp_path / "webhook.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "tessera.cli", "webhook", *args],
            cwd=ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=environment_without_proxies(),
        )
    return process, log


@pytest.fixture
def webhook(tmp_path: Path) -> Iterator[Webhook]:
    certs = make_serving_certificate(tmp_path / "tls", ["localhost", "127.0.0.1"])
    process, log = start(
        tmp_path,
        "--tls-cert-file", str(certs.cert_file), "--tls-key-file", str(certs.key_file),
        "--tls-host", "127.0.0.1", "--tls-port", "0", "--http-host", "127.0.0.1",
        "--http-port", "0", "--cert-check-s", "0.2",
    )  # fmt: skip
    running = Webhook(process, log, certs)
    try:
        running.wait_started()
        yield running
    finally:
        process.terminate()
        assert process.wait(timeout=20) == 0, log.read_text()


async def post(hook: Webhook, path: str, body: bytes) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"https://127.0.0.1:{hook.tls_port}{path}",
            data=body,
            headers={"Content-Type": "application/json"},
            ssl=hook.client_context(),
        ) as response:
            return response.status, await response.json()


async def test_reviews_are_answered_over_tls(webhook: Webhook) -> None:
    body = pod("p", container(memory=2048))
    body["spec"]["schedulerName"] = "default-scheduler"
    status, answer = await post(webhook, "/mutate", review_body(body, uid="u-1"))
    assert status == 200
    assert (answer["apiVersion"], answer["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    response = answer["response"]
    assert (response["uid"], response["allowed"], response["patchType"]) == (
        "u-1",
        True,
        "JSONPatch",
    )
    patch = json.loads(base64.b64decode(response["patch"]))
    assert {"op": "add", "path": "/spec/schedulerName", "value": "tessera"} in patch
    status, answer = await post(
        webhook, "/validate", review_body(pod("p", container(gpu=1, cores=150)), uid="u-2")
    )
    assert status == 200
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["message"] == (
        "Tessera cannot place this pod as written: spec.containers[0].resources.limits"
        "[tessera.dev/gpu-cores] (container 'main'): 150 is not allowed; use 1..100"
    )


async def test_through_kubectl_only_the_binder_may_write_tessera_s_annotations(
    webhook: Webhook, tmp_path: Path
) -> None:
    """The API double over HTTPS (kubectl sends its token only there) calls the webhook with
    who asks: an admin and a plain user editing ``tessera.dev/assignment`` are refused with a
    line saying why; the binder's service account marking the pod assigned is not."""
    async with ApiServer(tls=True) as api:
        register_webhook(api, f"https://127.0.0.1:{webhook.tls_port}", ca_pem=webhook.certs.ca_pem)
        assignment = json.dumps({"node": "n1", "containers": [], "decided_at": 1, "placer_id": "p"})
        api.create(
            POD,
            pod(
                "after-0",
                container(gpu=1, memory=16000),
                node="n1",
                annotations={"tessera.dev/assignment": assignment},
            ),
        )
        admin = api.write_kubeconfig(tmp_path / "admin.kubeconfig")
        alice = api.write_kubeconfig(
            tmp_path / "alice.kubeconfig", token=api.add_user(User("alice", ("team-a",)))
        )
        binder = api.write_kubeconfig(
            tmp_path / "binder.kubeconfig",
            token=api.add_user(service_account("tessera-system", "tessera-binder")),
        )
        edited = assignment.replace('"n1"', '"n2"')
        for kubeconfig, user in ((admin, "tessera-dev"), (alice, "alice")):
            refused = await kubectl(
                kubeconfig, "annotate", "pod", "after-0", "--overwrite",
                f"tessera.dev/assignment={edited}",
            )  # fmt: skip
            assert refused.returncode != 0
            assert (
                'admission webhook "validate.tessera.dev" denied the request: '
                "metadata.annotations[tessera.dev/assignment]: written by Tessera only (its "
                f"binder: system:serviceaccount:tessera-system:tessera-binder); user '{user}' "
                "may not set, change or remove it"
            ) in refused.stderr, refused.stderr
            removed = await kubectl(
                kubeconfig, "annotate", "pod", "after-0", "tessera.dev/assignment-"
            )
            assert removed.returncode != 0 and "written by Tessera only" in removed.stderr
        hint = await kubectl(alice, "annotate", "pod", "after-0", "tessera.dev/gpu-policy=spread")
        assert hint.returncode == 0, hint.stderr
        marked = await kubectl(binder, "annotate", "pod", "after-0", "tessera.dev/assigned=true")
        assert marked.returncode == 0, marked.stderr
        annotations = api.get(POD, "default", "after-0")["metadata"]["annotations"]
        assert annotations == {
            "tessera.dev/assignment": assignment,
            "tessera.dev/gpu-policy": "spread",
            "tessera.dev/assigned": "true",
        }
        denied_to = [write.body for write in api.writes_to("pods", "patch") if write.code == 403]
        assert len(denied_to) == 4


async def test_a_malformed_review_is_a_400_with_its_reason_and_the_webhook_goes_on(
    webhook: Webhook,
) -> None:
    for body, reason in (
        (b"{not json", "the body is not JSON"),
        (b'{"kind": 1}', "not an AdmissionReview"),
    ):
        status, answer = await post(webhook, "/validate", body)
        assert status == 400 and reason in answer["error"]
    status, _ = await post(webhook, "/validate", review_body(pod("p")))
    assert status == 200
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{webhook.http_port}/metrics") as response:
            metrics = await response.text()
        async with http.get(f"http://127.0.0.1:{webhook.http_port}/readyz") as response:
            assert response.status == 200
    assert 'tessera_webhook_reviews_total{outcome="bad_request",webhook="validate"} 2.0' in metrics
    assert 'tessera_webhook_reviews_total{outcome="allowed",webhook="validate"} 1.0' in metrics
    assert "tessera_nats_connected" not in metrics, "the webhook uses no NATS"


async def test_a_rotated_certificate_is_served_without_a_restart(
    webhook: Webhook, tmp_path: Path
) -> None:
    def served_serial(ca_pem: bytes) -> int:
        context = webhook.client_context(ca_pem)
        with socket.create_connection(("127.0.0.1", webhook.tls_port), timeout=5) as raw:
            with context.wrap_socket(raw, server_hostname="localhost") as tls:
                der = tls.getpeercert(binary_form=True)
        assert der is not None
        return x509.load_der_x509_certificate(der).serial_number

    first = served_serial(webhook.certs.ca_pem)
    rotated = make_serving_certificate(tmp_path / "rotated", ["localhost", "127.0.0.1"])
    # What a Secret volume update does: the files are replaced by new ones.
    rotated.key_file.replace(webhook.certs.key_file)
    rotated.cert_file.replace(webhook.certs.cert_file)
    deadline = time.monotonic() + 10
    while True:
        try:
            serial = await asyncio.to_thread(served_serial, rotated.ca_pem)
            break
        except ssl.SSLCertVerificationError:
            assert time.monotonic() < deadline, "the new certificate was never served"
            await asyncio.sleep(0.1)
    assert serial != first
    assert "serving certificate reloaded" in webhook.log.read_text()


def test_a_missing_certificate_stops_it_with_one_line(tmp_path: Path) -> None:
    process, log = start(
        tmp_path, "--tls-cert-file", str(tmp_path / "nope.crt"), "--http-port", "0"
    )
    assert process.wait(timeout=30) == 2
    text = log.read_text()
    assert "cannot load the serving certificate (--tls-cert-file" in text
    assert "No such file or directory" in text
