"""The webhook and DRA claims (pure): a pod naming a ``gpu.tessera.dev`` claim or template gets
Tessera's scheduler, is refused on any other (extender schedulers too), and a pod whose claims
the index does not know is let through as written, with a warning."""

from __future__ import annotations

import base64
import json
from typing import Any

import msgspec

from services.webhook.admission import (
    AdmissionPolicy,
    AdmissionRequest,
    Review,
    mutate,
    read_review,
    validate,
)
from services.webhook.claimindex import ClaimIndex
from shared import codec, subjects
from shared.messages.claimclasses import ClaimClasses, ClaimClassesListed, ClaimKind
from tests.webhook.test_admission import review_body

POLICY = AdmissionPolicy(extender_scheduler_names=("default-scheduler",))
CLASSES: dict[tuple[ClaimKind, str, str], tuple[str, ...]] = {
    ("template", "ml", "a100-slice"): ("gpu.tessera.dev",),
    ("claim", "ml", "shared-gpu"): ("gpu.tessera.dev", "nic.example.com"),
    ("template", "ml", "nic"): ("nic.example.com",),
}


def lookup(kind: ClaimKind, namespace: str, name: str) -> tuple[str, ...] | None:
    return CLASSES.get((kind, namespace, name))


def claim_pod(*claims: dict[str, str], scheduler: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "train:1"}],
        "resourceClaims": [{"name": f"c{i}", **claim} for i, claim in enumerate(claims)],
    }
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


def reviewed(webhook: str, obj: dict[str, Any]) -> Review:
    request = read_review(review_body(obj))
    assert isinstance(request, AdmissionRequest)
    review = (
        mutate(request, POLICY, lookup)
        if webhook == "mutate"
        else validate(request, POLICY, (), lookup)
    )
    assert isinstance(review, Review)
    return review


def patch_of(review: Review) -> list[dict[str, Any]]:
    patch: list[dict[str, Any]] = json.loads(base64.b64decode(review.answer.response.patch))
    return patch


def test_a_tessera_template_or_claim_gets_tessera_s_scheduler_even_where_an_extender_runs() -> None:
    for claim in ({"resourceClaimTemplateName": "a100-slice"}, {"resourceClaimName": "shared-gpu"}):
        for scheduler in (None, "default-scheduler"):
            review = reviewed("mutate", claim_pod(claim, scheduler=scheduler))
            assert review.outcome == "mutated"
            assert patch_of(review) == [
                {"op": "add", "path": "/spec/schedulerName", "value": "tessera"}
            ]
    other = reviewed("mutate", claim_pod({"resourceClaimTemplateName": "nic"}))
    assert (other.outcome, other.unknown) == ("allowed", ())
    assert other.answer.response.warnings == ()


def test_a_tessera_claim_on_another_scheduler_is_refused_with_one_exact_line() -> None:
    pod = claim_pod(
        {"resourceClaimTemplateName": "nic"},
        {"resourceClaimTemplateName": "a100-slice"},
        scheduler="default-scheduler",
    )
    review = reviewed("validate", pod)
    assert review.outcome == "denied" and review.reasons == ("spec.schedulerName",)
    status = review.answer.response.status
    assert status is not None and status.code == 422
    assert status.message == (
        'spec.schedulerName: "default-scheduler" may not place this pod: spec.resourceClaims[1] '
        '(ResourceClaimTemplate "a100-slice") asks for devices of class gpu.tessera.dev, which '
        "Tessera alone allocates (two allocators would book one GPU twice); set "
        'spec.schedulerName to "tessera" or leave it unset'
    )
    for allowed in (
        claim_pod({"resourceClaimName": "shared-gpu"}, scheduler="tessera"),
        claim_pod({"resourceClaimTemplateName": "nic"}, scheduler="x"),
    ):
        assert reviewed("validate", allowed).outcome == "allowed"
    bound = claim_pod({"resourceClaimName": "shared-gpu"}, scheduler="x")
    bound["spec"]["nodeName"] = "n1"
    assert reviewed("validate", bound).outcome == "allowed"


def test_a_name_the_index_does_not_know_is_let_through_with_a_warning() -> None:
    review = reviewed(
        "mutate",
        claim_pod(
            {"resourceClaimTemplateName": "made-just-now"}, {"resourceClaimTemplateName": "nic"}
        ),
    )
    assert review.outcome == "allowed"
    assert review.unknown == ('spec.resourceClaims[0] (ResourceClaimTemplate "made-just-now")',)
    assert review.answer.response.warnings == (
        'spec.resourceClaims[0] (ResourceClaimTemplate "made-just-now") is not known to Tessera '
        'yet: if it asks for gpu.tessera.dev devices, set spec.schedulerName to "tessera"',
    )
    answer = json.loads(msgspec.json.encode(review.answer))
    assert answer["response"]["warnings"] == list(review.answer.response.warnings)
    known = reviewed(
        "mutate",
        claim_pod(
            {"resourceClaimTemplateName": "made-just-now"}, {"resourceClaimName": "shared-gpu"}
        ),
    )
    assert known.outcome == "mutated" and known.unknown == (), "one Tessera claim decides it"


def test_the_index_knows_nothing_until_listed_and_read_and_ignores_what_it_cannot_believe() -> None:
    index = ClaimIndex()
    key = subjects.claim_class_key("template", "ml", "a100.slice")
    entry = ClaimClasses(
        kind="template", namespace="ml", name="a100.slice", classes=("gpu.tessera.dev",)
    )
    assert index.apply(key, codec.encode(entry)) == ""
    assert index.lookup("template", "ml", "a100.slice") is None
    index.mark_synced()
    assert index.lookup("template", "ml", "a100.slice") is None, "not listed by the binder yet"
    listed = codec.encode(ClaimClassesListed(objects=1))
    index.apply(subjects.CLAIM_CLASSES_LISTED, listed)
    assert index.lookup("template", "ml", "a100.slice") == ("gpu.tessera.dev",)
    assert index.lookup("template", "ml", "other") is None
    assert "do not decode" in index.apply("claim.ml.x", b"{")
    assert "name template ml/a100.slice" in index.apply("claim.ml.x", codec.encode(entry))
    index.apply(key, None)
    assert index.lookup("template", "ml", "a100.slice") is None and len(index) == 0
    index.restart()
    assert not index.known
