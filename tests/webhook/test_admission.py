"""The admission webhook's pure reviews: what is mutated, what is refused and with which line."""

from __future__ import annotations

import base64
import json
from typing import Any

import msgspec
import pytest

from services.webhook.admission import (
    AdmissionPolicy,
    AdmissionRequest,
    BadReview,
    Review,
    mutate,
    read_review,
    validate,
)
from shared.kubeobjects import Pod
from shared.podspec import InvalidPod, parse_pending
from tests.binder.builders import container, pod

POLICY = AdmissionPolicy()


BINDER = "system:serviceaccount:tessera-system:tessera-binder"
GUARDED = AdmissionPolicy(binder_usernames=(BINDER,))


def review_body(
    obj: dict[str, Any],
    *,
    operation: str = "CREATE",
    uid: str = "r-1",
    old: dict[str, Any] | None = None,
    user: str = "alice",
) -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "ml",
                "operation": operation,
                "userInfo": {"username": user, "groups": ["system:authenticated"]},
                "object": obj,
                "oldObject": old,
                "dryRun": False,
            },
        }
    ).encode()


def request_of(obj: dict[str, Any], **kwargs: Any) -> AdmissionRequest:
    request = read_review(review_body(obj, **kwargs))
    assert isinstance(request, AdmissionRequest), request
    return request


def patched(obj: dict[str, Any], review: Review) -> dict[str, Any]:
    """``obj`` after the review's JSONPatch (add operations, as the webhook writes them)."""
    response = review.answer.response
    assert response.patch_type == "JSONPatch"
    result: dict[str, Any] = json.loads(json.dumps(obj))
    for op in json.loads(base64.b64decode(response.patch)):
        assert op["op"] == "add"
        *parents, last = [
            t.replace("~1", "/").replace("~0", "~") for t in op["path"][1:].split("/")
        ]
        target = result
        for token in parents:
            target = target[int(token)] if isinstance(target, list) else target[token]
        target[last] = op["value"]
    return result


def default_scheduler(body: dict[str, Any]) -> dict[str, Any]:
    body["spec"]["schedulerName"] = "default-scheduler"  # what the API server defaults
    return body


def test_a_tessera_pod_without_a_scheduler_gets_tessera_s() -> None:
    body = default_scheduler(pod("p", container(gpu=1, memory=4096)))
    review = mutate(request_of(body), POLICY)
    assert not isinstance(review, BadReview)
    assert review.outcome == "mutated"
    assert review.answer.response.uid == "r-1" and review.answer.response.allowed
    assert patched(body, review)["spec"]["schedulerName"] == "tessera"
    assert review.reasons == ("spec.schedulerName: tessera",)


def test_a_memory_only_container_gets_one_share_in_limits_and_requests() -> None:
    body = default_scheduler(
        pod("p", container("a", memory=4096, cores=30), container("b", cpu="1", ram="1Gi"))
    )
    body["spec"]["containers"][0]["resources"]["requests"] = {"tessera.dev/gpu-memory": "4096"}
    review = mutate(request_of(body), POLICY)
    assert not isinstance(review, BadReview)
    after = patched(body, review)
    first, second = after["spec"]["containers"]
    assert first["resources"]["limits"]["tessera.dev/gpu"] == "1"
    assert first["resources"]["requests"]["tessera.dev/gpu"] == "1"
    assert "tessera.dev/gpu" not in second["resources"]["limits"], "asks for no GPU"
    parsed = parse_pending(msgspec.convert(after | {"metadata": {"name": "p"}}, Pod))
    assert not isinstance(parsed, InvalidPod), "the defaulted pod is valid"
    assert parsed.containers[0].gpu_shares == 1


def test_defaulting_the_share_count_can_be_switched_off() -> None:
    body = pod("p", container(memory=4096))
    off = AdmissionPolicy(default_gpu_shares=False)
    assert mutate(request_of(body), off).outcome == "allowed"  # type: ignore[union-attr]
    refused = validate(request_of(body), off)
    assert isinstance(refused, Review) and refused.outcome == "denied"
    assert "needs tessera.dev/gpu" in refused.answer.response.status.message  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("scheduler", "policy"),
    [
        pytest.param("my-scheduler", POLICY, id="another-scheduler-is-left-alone"),
        pytest.param(
            "default-scheduler",
            AdmissionPolicy(extender_scheduler_names=("default-scheduler",)),
            id="default-scheduler-running-the-extender",
        ),
    ],
)
def test_a_chosen_scheduler_is_kept(scheduler: str, policy: AdmissionPolicy) -> None:
    body = pod("p", container(gpu=1), scheduler=scheduler)
    assert mutate(request_of(body), policy).outcome == "allowed"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(default_scheduler(pod("web", container(cpu="1"))), id="no-tessera-resource"),
        pytest.param(
            default_scheduler(pod("p", container(gpu=1), node="gpu-1")), id="already-bound"
        ),
    ],
)
def test_pods_tessera_does_not_place_are_untouched(body: dict[str, Any]) -> None:
    for review in (mutate(request_of(body), POLICY), validate(request_of(body), POLICY)):
        assert isinstance(review, Review) and review.outcome == "allowed"
        assert review.answer.response.patch == ""


def test_an_invalid_request_is_refused_with_the_binder_s_line() -> None:
    body = pod("p", container(gpu=1, extra={"tessera.dev/gpu-memory": "1Gi"}, cores=150))
    review = validate(request_of(body), POLICY)
    assert isinstance(review, Review) and review.outcome == "denied"
    response = review.answer.response
    assert not response.allowed and response.uid == "r-1"
    binder_line = parse_pending(msgspec.convert(body | {"metadata": {"name": "p"}}, Pod))
    assert isinstance(binder_line, InvalidPod)
    assert response.status is not None
    assert (response.status.code, response.status.reason) == (422, "Invalid")
    assert response.status.message == binder_line.reason
    assert response.status.message.startswith("Tessera cannot place this pod as written: ")
    assert "for 1Gi write 1024" in response.status.message
    assert review.reasons == (
        "spec.containers[0].resources.limits[tessera.dev/gpu-memory] (container 'main')",
        "spec.containers[0].resources.limits[tessera.dev/gpu-cores] (container 'main')",
    )


def test_a_valid_request_and_other_operations_are_allowed() -> None:
    assert validate(request_of(pod("p")), POLICY).outcome == "allowed"  # type: ignore[union-attr]
    bad = pod("p", container(gpu=1, cores=500))
    for operation in ("UPDATE", "DELETE", "CONNECT"):
        review = validate(request_of(bad, operation=operation), POLICY)
        assert isinstance(review, Review) and review.outcome == "allowed"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param(b"{", "the body is not JSON", id="not-json"),
        pytest.param(b"[]", "not an AdmissionReview", id="not-an-object"),
        pytest.param(
            json.dumps(
                {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}
            ).encode(),
            "expected apiVersion admission.k8s.io/v1 kind AdmissionReview, got apiVersion "
            "admission.k8s.io/v1beta1",
            id="v1beta1",
        ),
        pytest.param(
            json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(),
            "the AdmissionReview has no request",
            id="no-request",
        ),
    ],
)
def test_a_malformed_review_is_a_bad_review_with_its_reason(body: bytes, reason: str) -> None:
    found = read_review(body)
    assert isinstance(found, BadReview) and reason in found.reason


def test_a_pod_review_whose_object_is_not_a_pod_is_a_bad_review() -> None:
    request = request_of({"spec": {"containers": "not a list"}})
    for review in (mutate(request, POLICY), validate(request, POLICY)):
        assert isinstance(review, BadReview) and "request.object is not a pod" in review.reason


ASSIGNMENT = '{"node":"n1","containers":[],"decided_at":1.0,"placer_id":"p"}'


def annotated(**annotations: str) -> dict[str, Any]:
    """A bound Tessera pod carrying ``annotations``."""
    body = pod("p", container(gpu=1, memory=4096), annotations=annotations or None)
    body["spec"]["nodeName"] = "n1"
    return body


@pytest.mark.parametrize(
    ("operation", "old", "new", "user", "refused"),
    [
        pytest.param(
            "UPDATE",
            annotated(**{"tessera.dev/assignment": ASSIGNMENT}),
            annotated(**{"tessera.dev/assignment": ASSIGNMENT.replace("n1", "n2")}),
            "alice",
            ["tessera.dev/assignment"],
            id="owner-edits-the-assignment",
        ),
        pytest.param(
            "UPDATE",
            annotated(**{"tessera.dev/assigned": "true", "tessera.dev/bind-time": "t"}),
            annotated(),
            "alice",
            ["tessera.dev/bind-time", "tessera.dev/assigned"],
            id="owner-removes-two",
        ),
        pytest.param(
            "CREATE",
            None,
            annotated(**{"tessera.dev/assignment": ASSIGNMENT}),
            "system:serviceaccount:ml:replicaset-controller",
            ["tessera.dev/assignment"],
            id="created-with-one",
        ),
        pytest.param(
            "UPDATE",
            annotated(**{"tessera.dev/assignment": ASSIGNMENT}),
            annotated(**{"tessera.dev/assignment": ASSIGNMENT, "team": "b"}),
            "alice",
            [],
            id="other-annotations-change",
        ),
        pytest.param(
            "UPDATE",
            annotated(),
            annotated(**{"tessera.dev/assigned": "true"}),
            BINDER,
            [],
            id="the-binder-marks-it-assigned",
        ),
        pytest.param(
            "UPDATE",
            annotated(**{"tessera.dev/gpu-policy": "spread"}),
            annotated(**{"tessera.dev/gpu-policy": "binpack"}),
            "alice",
            [],
            id="user-hints-are-the-owner-s",
        ),
    ],
)
def test_tessera_s_annotations_are_written_by_its_binder_only(
    operation: str,
    old: dict[str, Any] | None,
    new: dict[str, Any],
    user: str,
    refused: list[str],
) -> None:
    request = read_review(review_body(new, operation=operation, old=old, user=user))
    assert isinstance(request, AdmissionRequest)
    review = validate(request, GUARDED)
    assert isinstance(review, Review)
    fields = [f"metadata.annotations[{key}]" for key in refused]
    assert list(review.reasons) == fields
    assert review.outcome == ("denied" if refused else "allowed")
    status = review.answer.response.status
    if refused:
        assert status is not None and (status.code, status.reason) == (403, "Forbidden")
        assert status.message == (
            f"{', '.join(fields)}: written by Tessera only (its binder: {BINDER}); user "
            f"{user!r} may not set, change or remove {'it' if len(fields) == 1 else 'them'}"
        )


def applied(body: dict[str, Any], memory: str | int) -> dict[str, Any]:
    """``body`` as ``kubectl apply`` creates it: what it sent (``memory`` as written) kept in
    its last-applied annotation, the pod itself holding the API server's canonical form."""
    sent = json.loads(json.dumps(body))
    sent["spec"]["containers"][0]["resources"]["limits"]["tessera.dev/gpu-memory"] = memory
    annotation = {"kubectl.kubernetes.io/last-applied-configuration": json.dumps(sent)}
    body["metadata"]["annotations"] = annotation
    return body


A100_NODE = (("A100-80GB", 81920),) * 4
T4_NODE = (("T4", 15360),) * 2
CLUSTER = frozenset({A100_NODE, T4_NODE})
GPU_MEMORY = "spec.containers[0].resources.limits[tessera.dev/gpu-memory] (container 'main')"
GPU = "spec.containers[0].resources.limits[tessera.dev/gpu] (container 'main')"


@pytest.mark.parametrize(
    ("body", "cluster", "line"),
    [
        pytest.param(
            pod("p", container(gpu=1, memory=200_000)),
            CLUSTER,
            f"{GPU_MEMORY}: asks 200000 MiB per GPU; the largest GPU here has 81920 MiB",
            id="memory-beyond-the-largest-gpu",
        ),
        pytest.param(
            pod("p", container(gpu=9)),
            CLUSTER,
            f"{GPU}: asks 9 GPUs; a node here has at most 4 GPUs",
            id="more-gpus-than-a-node-has",
        ),
        pytest.param(
            pod("p", container(gpu=3, memory=20_000), annotations={"tessera.dev/gpu-model": "T4"}),
            CLUSTER,
            f"{GPU_MEMORY}: asks 20000 MiB per GPU; the largest GPU of model T4 here has 15360 MiB",
            id="memory-beyond-the-largest-gpu-of-the-model",
        ),
        pytest.param(
            pod("p", container(gpu=1), annotations={"tessera.dev/gpu-model": "H100"}),
            CLUSTER,
            "metadata.annotations[tessera.dev/gpu-model]: asks GPUs of model H100; no node here "
            "has one",
            id="no-gpu-of-the-model",
        ),
        pytest.param(
            pod("p", container(gpu=1, extra={"tessera.dev/gpu-memory": "2000000"})),
            frozenset(),
            f"{GPU_MEMORY}: asks 2000000 MiB per GPU; no GPU has more than 1048576 MiB (1 TiB)",
            id="beyond-1-tib-whatever-the-cluster",
        ),
        pytest.param(
            pod("p", container(gpu=1, extra={"tessera.dev/gpu-memory": "2000m"})),
            frozenset(),
            f"{GPU_MEMORY}: '2000m' means 2 (m is thousandths), but tessera.dev/gpu-memory counts "
            "MiB and takes a plain number; for 2000 MiB write 2000",
            id="milli-mib",
        ),
        pytest.param(
            applied(pod("p", container(gpu=1, extra={"tessera.dev/gpu-memory": "2"})), "2000m"),
            CLUSTER,
            f"{GPU_MEMORY}: '2000m' means 2 (m is thousandths), but tessera.dev/gpu-memory counts "
            "MiB and takes a plain number; for 2000 MiB write 2000",
            id="milli-mib-as-kubectl-apply-sent-it",
        ),
        pytest.param(
            applied(pod("p", container(gpu=1, extra={"tessera.dev/gpu-memory": "2k"})), 2000),
            CLUSTER,
            None,
            id="as-applied-in-another-form",
        ),
        pytest.param(pod("p", container(gpu=4, memory=81920)), CLUSTER, None, id="fits-exactly"),
        pytest.param(
            pod("p", container(gpu=9, memory=200_000)), frozenset(), None, id="cluster-unknown"
        ),
    ],
)
def test_what_no_node_could_ever_hold_is_refused_with_the_number(
    body: dict[str, Any], cluster: frozenset[tuple[tuple[str, int], ...]], line: str | None
) -> None:
    review = validate(request_of(body), GUARDED, cluster)
    assert isinstance(review, Review)
    status = review.answer.response.status
    if line is None:
        assert review.outcome == "allowed", status
        return
    assert review.outcome == "denied"
    assert status is not None and status.code == 422
    assert status.message == f"Tessera cannot place this pod as written: {line}"
