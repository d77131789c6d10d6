"""The binder's index of claim classes, read by the webhook: real parts end to end (the binder in
DRA mode against the API double over the real client, a real nats-server, ``tessera webhook`` as
a process reviewing over TLS). A pod naming a ``gpu.tessera.dev`` template gets Tessera's
scheduler, is refused on another, a template created an instant before its pod is waited for,
and a name nobody publishes is let through with a warning and counted."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path
from typing import Any

import aiohttp

from shared import subjects
from shared.runtime.nats import NatsBus
from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.certs import make_serving_certificate
from tessera.devcluster.resources import RESOURCE_CLAIM, RESOURCE_CLAIM_TEMPLATE
from tests.binder.conftest import BinderFactory
from tests.harness.nats import NatsServer
from tests.harness.wait import eventually
from tests.webhook.test_admission import review_body
from tests.webhook.test_process import Webhook, post, start

NAMESPACE = "ml"


def devices(device_class: str) -> dict[str, Any]:
    return {
        "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}
    }


def template(name: str, device_class: str = "gpu.tessera.dev") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": devices(device_class)},
    }


def claim(name: str, *, owner: str = "") -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if owner:  # made by kube-controller-manager from a template, for one pod
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": owner, "uid": "u-1", "controller": True}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": devices("gpu.tessera.dev"),
    }


def claim_pod(template_name: str, scheduler: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": "train:1", "resources": {"claims": [{"name": "gpu"}]}}
        ],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template_name}],
    }
    if scheduler:
        spec["schedulerName"] = scheduler
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": NAMESPACE},
        "spec": spec,
    }


async def published(bus: NatsBus) -> set[str]:
    return {e.key for e in await bus.kv_list(subjects.KV_CLAIM_CLASSES, ">") if not e.deleted}


async def test_the_webhook_reads_the_classes_the_binder_publishes(
    api: ApiServer,
    start_binder: BinderFactory,
    nats_server: NatsServer,
    bus: NatsBus,
    tmp_path: Path,
) -> None:
    api.create(RESOURCE_CLAIM_TEMPLATE, template("a100-slice"), NAMESPACE)
    api.create(RESOURCE_CLAIM_TEMPLATE, template("nic", "nic.example.com"), NAMESPACE)
    api.create(RESOURCE_CLAIM, claim("shared-gpu"), NAMESPACE)
    api.create(RESOURCE_CLAIM, claim("p-gpu-x1", owner="p"), NAMESPACE)
    certs = make_serving_certificate(tmp_path / "tls", ["127.0.0.1"])
    process, log = start(
        tmp_path,
        "--tls-cert-file", str(certs.cert_file), "--tls-key-file", str(certs.key_file),
        "--tls-host", "127.0.0.1", "--tls-port", "0", "--http-host", "127.0.0.1",
        "--http-port", "0", "--nats-url", nats_server.url, "--claim-wait-s", "3",
    )  # fmt: skip
    webhook = Webhook(process, log, certs)
    try:
        webhook.wait_started()
        # No binder yet, so no index: nothing to wait for, the pod goes through with a warning.
        started = time.monotonic()
        _, answer = await post(webhook, "/mutate", review_body(claim_pod("a100-slice")))
        assert time.monotonic() - started < 2.5, "no wait without an index"
        assert "patch" not in answer["response"] and len(answer["response"]["warnings"]) == 1
        async with start_binder(dra=True):
            wanted = {"template.ml.a100-slice", "template.ml.nic", "claim.ml.shared-gpu", "_listed"}

            async def all_published() -> bool:
                return await published(bus) == wanted

            await eventually(
                all_published, what="every template and user-made claim, and the word that all are"
            )

            async def metrics() -> str:
                async with aiohttp.ClientSession() as http:
                    url = f"http://127.0.0.1:{webhook.http_port}/metrics"
                    async with http.get(url) as response:
                        return await response.text()

            async def knows_three() -> bool:
                return "tessera_webhook_claim_classes 3.0" in await metrics()

            await eventually(knows_three, what="the webhook to know the three objects")

            status, answer = await post(webhook, "/mutate", review_body(claim_pod("a100-slice")))
            assert status == 200
            patch = json.loads(base64.b64decode(answer["response"]["patch"]))
            assert patch == [{"op": "add", "path": "/spec/schedulerName", "value": "tessera"}]
            _, answer = await post(
                webhook, "/validate", review_body(claim_pod("a100-slice", "volcano"))
            )
            assert answer["response"]["allowed"] is False
            assert answer["response"]["status"]["message"].startswith(
                'spec.schedulerName: "volcano" may not place this pod: spec.resourceClaims[0] '
                '(ResourceClaimTemplate "a100-slice") asks for devices of class gpu.tessera.dev'
            )
            _, answer = await post(webhook, "/mutate", review_body(claim_pod("nic")))
            assert answer["response"] == {"uid": "r-1", "allowed": True}

            # ``kubectl apply`` of a template and its pod in one file: the pod's review waits.
            review = asyncio.create_task(
                post(webhook, "/mutate", review_body(claim_pod("fresh"), uid="r-2"))
            )
            await asyncio.sleep(0.3)
            assert not review.done()
            api.create(RESOURCE_CLAIM_TEMPLATE, template("fresh"), NAMESPACE)
            _, answer = await review
            assert answer["response"]["patchType"] == "JSONPatch"

            _, answer = await post(webhook, "/mutate", review_body(claim_pod("never")))
            assert answer["response"]["allowed"] is True and "patch" not in answer["response"]
            assert answer["response"]["warnings"] == [
                'spec.resourceClaims[0] (ResourceClaimTemplate "never") is not known to Tessera '
                'yet: if it asks for gpu.tessera.dev devices, set spec.schedulerName to "tessera"'
            ]
            assert "tessera_webhook_unknown_claims_total 2.0" in await metrics()

            api.delete(RESOURCE_CLAIM_TEMPLATE, NAMESPACE, "a100-slice")

            async def forgotten() -> bool:
                return "template.ml.a100-slice" not in await published(bus)

            await eventually(forgotten, what="a deleted template's entry deleted")
    finally:
        process.terminate()
        assert process.wait(timeout=20) == 0, log.read_text()
