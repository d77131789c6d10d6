"""The admission webhook in the chart: its certificate (made by the chart, or cert-manager's), the
webhook configurations the API server reads, and the Deployment that serves them."""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.resources import SECRET
from tests.deploy.chart import (
    CERT_MANAGER_API,
    CHART_DIR,
    NAMESPACE,
    RELEASE,
    Object,
    component,
    containers,
    named,
    of_kind,
    option_values,
    render,
    run_helm,
)
from tests.deploy.variants import VARIANTS

NAME = component("webhook")
SERVICE_NAMES = {NAME, f"{NAME}.{NAMESPACE}", f"{NAME}.{NAMESPACE}.svc"}
CONFIG_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def configurations(objects: tuple[Object, ...]) -> dict[str, Object]:
    """``mutate`` / ``validate`` -> the one webhook of each configuration."""
    found = {}
    for kind in CONFIG_KINDS:
        (config,) = of_kind(objects, kind)
        (hook,) = config["webhooks"]
        found[hook["clientConfig"]["service"]["path"].strip("/")] = hook | {"_config": config}
    return found


def decoded(secret: Object, key: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(base64.b64decode(secret["data"][key]))


def test_the_chart_makes_a_certificate_the_api_server_trusts_for_the_service() -> None:
    objects = render({})
    secret = named(objects, "Secret", f"{NAME}-tls")
    assert secret["type"] == "kubernetes.io/tls"
    ca, serving = decoded(secret, "ca.crt"), decoded(secret, "tls.crt")
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.DNSName)) == SERVICE_NAMES
    public = ca.public_key()
    assert isinstance(public, rsa.RSAPublicKey)
    assert serving.signature_hash_algorithm is not None
    public.verify(  # raises when the CA did not sign it
        serving.signature,
        serving.tbs_certificate_bytes,
        padding.PKCS1v15(),
        serving.signature_hash_algorithm,
    )
    expires = serving.not_valid_after_utc
    now = datetime.datetime.now(datetime.UTC)
    assert datetime.timedelta(days=364) < expires - now <= datetime.timedelta(days=366)
    annotated = int(secret["metadata"]["annotations"]["tessera.dev/not-after"])
    assert abs(annotated - expires.timestamp()) < 120, "the renewal check reads this date"
    for hook in configurations(objects).values():
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == base64.b64decode(
            secret["data"]["ca.crt"]
        )


def test_the_configurations_reach_the_webhook_s_service_and_container() -> None:
    objects = render({})
    service = named(objects, "Service", NAME)
    (https,) = [p for p in service["spec"]["ports"] if p["name"] == "webhook"]
    (webhook,) = [c for c in containers(objects) if c.spec["name"] == "webhook"]
    (target,) = [p for p in webhook.spec["ports"] if p["name"] == https["targetPort"]]
    args = option_values(webhook.args())
    assert int(args["--tls-port"]) == target["containerPort"]
    hooks = configurations(objects)
    assert set(hooks) == {"mutate", "validate"}
    for path, hook in hooks.items():
        assert hook["name"] == f"{path}.tessera.dev"
        assert hook["clientConfig"]["service"] == {
            "name": NAME,
            "namespace": NAMESPACE,
            "path": f"/{path}",
            "port": https["port"],
        }
        assert hook["rules"] == [
            {
                # Validating: also every change to Tessera's annotations (the webhook refuses
                # them from anyone but the binder).
                "operations": ["CREATE"] if path == "mutate" else ["CREATE", "UPDATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ]
        assert (hook["failurePolicy"], hook["sideEffects"]) == ("Fail", "None")
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["namespaceSelector"] == {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": [NAMESPACE, "kube-system"],
                }
            ]
        }
        condition = hook["matchConditions"][0]
        assert "startsWith('tessera.dev/')" in condition["expression"]
        assert "initContainers" in condition["expression"]
    written = "['tessera.dev/assignment', 'tessera.dev/bind-time', 'tessera.dev/assigned']"
    assert written not in hooks["mutate"]["matchConditions"][0]["expression"]
    assert len(hooks["mutate"]["matchConditions"]) == 1
    annotations, binder = hooks["validate"]["matchConditions"]
    for side in ("object", "oldObject"):
        assert f"{side}.metadata.annotations.exists(k, k in {written})" in annotations["expression"]
    binder_account = f"system:serviceaccount:{NAMESPACE}:{component('binder')}"
    assert binder["expression"] == f"request.userInfo.username != '{binder_account}'"
    assert hooks["mutate"]["reinvocationPolicy"] == "IfNeeded"
    # The files the webhook serves come from the Secret the certificate is in.
    mount = next(m for m in webhook.spec["volumeMounts"] if m["name"] == "tls")
    assert args["--tls-cert-file"] == f"{mount['mountPath']}/tls.crt"
    assert args["--tls-key-file"] == f"{mount['mountPath']}/tls.key"
    assert webhook.volume("tls")["secret"]["secretName"] == f"{NAME}-tls"
    assert not webhook.volume("tls")["secret"]["defaultMode"] & 0o004, "key not world-readable"
    assert args["--scheduler-name"] == "tessera" and "--default-gpu-shares" in args
    assert args["--binder-usernames"] == binder_account, "the binder's service account"
    assert webhook.pod["automountServiceAccountToken"] is False, "no Kubernetes API access"


def test_cert_manager_makes_and_injects_the_certificate_when_the_cluster_has_it() -> None:
    objects = render(VARIANTS["webhook-cert-manager"], [CERT_MANAGER_API])
    assert not [s for s in of_kind(objects, "Secret") if s["metadata"]["name"] == f"{NAME}-tls"]
    assert of_kind(objects, "Issuer") == [], "the operator's ClusterIssuer signs it"
    (certificate,) = of_kind(objects, "Certificate")
    spec = certificate["spec"]
    assert spec["secretName"] == f"{NAME}-tls"
    assert set(spec["dnsNames"]) == SERVICE_NAMES
    assert spec["issuerRef"] == {"kind": "ClusterIssuer", "name": "internal-ca"}
    assert (spec["duration"], spec["renewBefore"]) == ("8760h", "720h")
    for hook in configurations(objects).values():
        assert "caBundle" not in hook["clientConfig"]
        annotations = hook["_config"]["metadata"]["annotations"]
        assert annotations["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{NAME}"
        assert hook["failurePolicy"] == "Ignore"
        values = hook["namespaceSelector"]["matchExpressions"][0]["values"]
        assert values == [NAMESPACE, "kube-system", "batch-legacy"]
    own = render({}, [CERT_MANAGER_API])
    (issuer,) = of_kind(own, "Issuer")
    assert issuer["spec"] == {"selfSigned": {}}
    assert of_kind(own, "Certificate")[0]["spec"]["issuerRef"] == {
        "kind": "Issuer",
        "name": issuer["metadata"]["name"],
    }


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({}, ["--scheduler-name=tessera", "--default-gpu-shares"], id="default"),
        pytest.param(
            {
                "schedulerName": "gpu-sched",
                "extender": {"enabled": True},
                "webhook": {"defaultGpuShares": False},
            },
            [
                "--scheduler-name=gpu-sched",
                "--extender-scheduler-names=tessera-extender",
                "--no-default-gpu-shares",
            ],
            id="extender-and-no-defaulting",
        ),
    ],
)
def test_the_webhook_follows_the_chart_s_schedulers(
    values: dict[str, Any], expected: list[str]
) -> None:
    (webhook,) = [c for c in containers(render(values)) if c.spec["name"] == "webhook"]
    for arg in expected:
        assert arg in webhook.args()


def test_without_the_webhook_nothing_of_it_is_rendered() -> None:
    objects = render(VARIANTS["no-webhook"])
    assert not [o for o in objects if o["metadata"]["name"].startswith(NAME)]
    for kind in CONFIG_KINDS:
        assert of_kind(objects, kind) == []


async def test_an_upgrade_keeps_the_certificate_until_it_is_due_for_renewal(
    tmp_path: Path,
) -> None:
    """The chart looks up its Secret on the cluster (``lookup``): helm against the API test
    double (``--dry-run=server``, which lets templates read the cluster) renders the same
    certificate again while it is valid beyond renewBeforeDays, and a new one when it is due."""

    async with ApiServer(token="") as api:  # helm sends no token over plain http
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")

        async def rendered_secret() -> Object:
            done = await asyncio.to_thread(
                run_helm,
                "install", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE,
                "--dry-run=server", "--disable-openapi-validation", "--output", "json",
                "--kubeconfig", str(kubeconfig),
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            manifest = json.loads(done.stdout)["manifest"]
            objects = [doc for doc in yaml.safe_load_all(manifest) if doc]
            return named(tuple(objects), "Secret", f"{NAME}-tls")

        first = await rendered_secret()
        written = json.loads(json.dumps(first))  # as the install wrote it, owned by the release
        written["metadata"]["annotations"] |= {
            "meta.helm.sh/release-name": RELEASE,
            "meta.helm.sh/release-namespace": NAMESPACE,
        }
        stored = api.create(SECRET, written, NAMESPACE)
        again = await rendered_secret()
        assert again["data"] == first["data"], "an upgrade keeps the certificate"
        assert again["metadata"]["annotations"] == first["metadata"]["annotations"]
        soon = int(time.time()) + 10 * 86400  # inside renewBeforeDays (30)
        api.patch(
            SECRET,
            NAMESPACE,
            stored["metadata"]["name"],
            {"metadata": {"annotations": {"tessera.dev/not-after": str(soon)}}},
            "application/merge-patch+json",
        )
        renewed = await rendered_secret()
    assert renewed["data"]["tls.crt"] != first["data"]["tls.crt"], "renewed when due"
    assert renewed["data"]["ca.crt"] != first["data"]["ca.crt"]
    not_after = int(renewed["metadata"]["annotations"]["tessera.dev/not-after"])
    assert not_after > time.time() + 364 * 86400
