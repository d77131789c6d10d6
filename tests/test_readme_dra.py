"""The README's DRA example (its "DRA mode" section): each manifest is valid against the strict
Kubernetes 1.37 schemas, and Tessera reads the pod's claim from the template as the binder and
the placer read claims: one GPU whose model is an A100, 8 GiB and 25 % of its SMs; and the
webhook gives the pod Tessera's scheduler."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import msgspec
import yaml

from services.binder import draalloc
from services.binder.rules.draobjects import ResourceClaim, pod_claims
from services.placer.rules import translate
from services.webhook.admission import (
    AdmissionPolicy,
    AdmissionRequest,
    Review,
    mutate,
    read_review,
)
from shared.dra.claims import ClaimPlan, plan_claims
from shared.dra.devices import DEFAULT_POLICY
from shared.kubeobjects import Pod
from shared.messages.pods import PodPending
from shared.podspec import parse_pending
from tests.webhook.test_admission import review_body

README = Path(__file__).resolve().parents[1] / "README.md"
STRICT_VERSION = "1.37.0"


def dra_manifests() -> dict[str, dict[str, Any]]:
    """The README's DRA manifests, by kind."""
    text = README.read_text()
    start = text.index("\n## DRA mode\n")
    section = text[start : text.index("\n## ", start + 1)]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.S)
    documents = [doc for block in blocks for doc in yaml.safe_load_all(block) if doc]
    found = {doc["kind"]: doc for doc in documents}
    assert len(found) == len(documents), "one manifest of each kind"
    return found


def test_the_readme_dra_manifests_are_valid_against_the_strict_1_37_schemas() -> None:
    manifests = dra_manifests()
    assert set(manifests) == {"ResourceClaimTemplate", "Pod"}
    for manifest in manifests.values():
        kubernetes_validate.validate(manifest, STRICT_VERSION, strict=True)


def test_tessera_reads_the_readme_claim_as_8_gib_and_25_percent_of_one_a100() -> None:
    manifests = dra_manifests()
    template, pod_manifest = manifests["ResourceClaimTemplate"], manifests["Pod"]
    namespace = pod_manifest["metadata"]["namespace"]
    # What kube-controller-manager makes of the template for the pod, and records in its status.
    claim = msgspec.convert(
        {
            "metadata": {"name": "train-gpu-x7", "namespace": namespace, "uid": "c-1"},
            "spec": template["spec"]["spec"],
        },
        ResourceClaim,
    )
    entry = pod_manifest["spec"]["resourceClaims"][0]
    assert entry["resourceClaimTemplateName"] == template["metadata"]["name"]
    status = {
        "resourceClaimStatuses": [{"name": entry["name"], "resourceClaimName": "train-gpu-x7"}]
    }
    pod = msgspec.convert(
        {
            **pod_manifest,
            "metadata": {**pod_manifest["metadata"], "uid": "p-1"},
            "spec": {**pod_manifest["spec"], "schedulerName": "tessera"},
            "status": status,
        },
        Pod,
    )
    claims = pod_claims(pod, {f"{namespace}/train-gpu-x7": claim}.get)
    plan = plan_claims(claims, policy=DEFAULT_POLICY)
    assert isinstance(plan, ClaimPlan), plan
    (ask,) = plan.asks
    assert (ask.count, ask.memory_mib, ask.compute) == (1, 8192, 25)

    parsed = parse_pending(pod)
    assert isinstance(parsed, PodPending), parsed
    pending = draalloc.with_claims(parsed, claims, policy=DEFAULT_POLICY)
    assert isinstance(pending, PodPending), pending
    request = translate.pod_request(pending)
    (container,) = [c for c in request.containers if c.shares]
    assert container.name == "resourceclaims/train-gpu-x7/gpu"
    assert (container.shares, container.share_memory_mib, container.share_core_milli) == (
        1,
        8192,
        250,
    )
    assert request.allows_model("NVIDIA A100-SXM4-80GB") and request.allows_model("A100-80GB")
    assert not request.allows_model("NVIDIA H100 80GB HBM3")


def test_the_webhook_gives_the_readme_pod_tessera_s_scheduler() -> None:
    manifests = dra_manifests()
    template = manifests["ResourceClaimTemplate"]["metadata"]
    known = {("template", template["namespace"], template["name"]): ("gpu.tessera.dev",)}
    request = read_review(review_body(manifests["Pod"]))
    assert isinstance(request, AdmissionRequest)
    review = mutate(request, AdmissionPolicy(), lambda *key: known.get(key))
    assert isinstance(review, Review) and review.outcome == "mutated"
    assert review.reasons == ("spec.schedulerName: tessera",)
