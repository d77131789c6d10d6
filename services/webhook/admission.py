"""Pure: Tessera's admission webhook (DESIGN section 13) over AdmissionReview v1.

Two reviews of a pod being created, as the API server asks them (mutating first, then validating
the mutated pod):

- **mutate** (``/mutate``): a pod asking for ``tessera.dev/*`` resources whose scheduler is
  unset or ``default-scheduler`` (and not one of the extender schedulers the operator named) gets
  ``spec.schedulerName`` set to Tessera's; a container that gives a slice (memory, memory
  percentage or cores) without ``tessera.dev/gpu`` gets ``tessera.dev/gpu: 1`` in its limits
  (and requests), as HAMi defaults its GPU count, unless the operator turned that off. The
  answer is a JSONPatch.
- **validate** (``/validate``): a pod of Tessera's schedulers asking for Tessera resources is
  refused when Tessera could never place it as written, with exactly the one line the binder
  would write on it (``shared.podspec``: the same parse, the same reasons). That includes a
  scheduling constraint Tessera's own scheduler does not implement (a field, operator or policy
  a later Kubernetes adds), named by its field: refused, never ignored.

Pods already bound (``spec.nodeName``), pods of other schedulers, pods asking for no Tessera
resource and every other operation are allowed untouched. A body that is not an AdmissionReview
v1 is a :class:`BadReview` (the shell answers 400 with its reason), never an exception.
"""

from __future__ import annotations

import base64
from typing import Any, Final, Literal

import msgspec

from shared import annotations as names
from shared.kubeobjects import Container, Pod
from shared.podspec import InvalidPod, parse_pending, requests_tessera

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"
DEFAULT_SCHEDULER: Final = "default-scheduler"
SLICE_RESOURCES: Final = names.RESOURCES[1:]
"""Resources that give a slice of a share (memory, memory percentage, cores)."""

Outcome = Literal["allowed", "mutated", "denied"]


class AdmissionPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """What the operator chose (``tessera webhook`` settings)."""

    scheduler_name: str = "tessera"
    """Set on pods that ask for Tessera resources without choosing a scheduler."""
    extender_scheduler_names: tuple[str, ...] = ()
    """Schedulers that ask Tessera's extender: their pods keep their scheduler name."""
    default_gpu_shares: bool = True
    """A container giving a slice without ``tessera.dev/gpu`` gets one share."""


class GroupVersionResource(msgspec.Struct, frozen=True, kw_only=True):
    group: str = ""
    version: str = ""
    resource: str = ""


class AdmissionRequest(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The part of ``AdmissionReview.request`` a review reads."""

    uid: str
    resource: GroupVersionResource = GroupVersionResource()
    sub_resource: str = ""
    namespace: str = ""
    operation: str = ""
    object: msgspec.Raw = msgspec.Raw()
    """The pod, kept undecoded until a review needs it (empty when absent)."""


class AdmissionReview(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    api_version: str = ""
    kind: str = ""
    request: AdmissionRequest | None = None


class Status(msgspec.Struct, frozen=True, kw_only=True):
    code: int
    reason: str
    message: str


class AdmissionResponse(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True
):
    uid: str
    allowed: bool
    status: Status | None = None
    patch_type: str = ""
    patch: str = ""
    """Base64 of the JSONPatch."""


class ReviewAnswer(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The AdmissionReview sent back."""

    api_version: str = API_VERSION
    kind: str = KIND
    response: AdmissionResponse


class Review(msgspec.Struct, frozen=True, kw_only=True):
    """A review's answer and what it did (for counting)."""

    answer: ReviewAnswer
    outcome: Outcome
    reasons: tuple[str, ...] = ()
    """What was changed (mutate) or refused (validate), one entry per field."""


class BadReview(msgspec.Struct, frozen=True, kw_only=True):
    """A body that is not an AdmissionReview v1 this webhook can answer."""

    reason: str


def read_review(body: bytes) -> AdmissionRequest | BadReview:
    """The request of an AdmissionReview v1, or why ``body`` is not one."""
    try:
        review = msgspec.json.decode(body, type=AdmissionReview)
    except msgspec.ValidationError as error:
        return BadReview(reason=f"not an AdmissionReview: {error}")
    except msgspec.DecodeError as error:
        return BadReview(reason=f"the body is not JSON: {error}")
    if review.api_version != API_VERSION or review.kind != KIND:
        return BadReview(
            reason=f"expected apiVersion {API_VERSION} kind {KIND}, got apiVersion "
            f"{review.api_version or '(none)'} kind {review.kind or '(none)'}"
        )
    if review.request is None or not review.request.uid:
        return BadReview(reason="the AdmissionReview has no request (or a request without uid)")
    return review.request


def _reviewed_pod(request: AdmissionRequest) -> Pod | BadReview | None:
    """The pod a review is about, None when the review is not about creating a pod."""
    resource = request.resource
    if (
        request.operation != "CREATE"
        or (resource.group, resource.resource) != ("", "pods")
        or request.sub_resource
    ):
        return None
    if not request.object or bytes(request.object) == b"null":
        return BadReview(reason="a pod CREATE review without the pod (request.object)")
    try:
        return msgspec.json.decode(request.object, type=Pod)
    except (msgspec.ValidationError, msgspec.DecodeError) as error:
        return BadReview(reason=f"request.object is not a pod: {error}")


def _allowed(request: AdmissionRequest) -> Review:
    return Review(
        answer=ReviewAnswer(response=AdmissionResponse(uid=request.uid, allowed=True)),
        outcome="allowed",
    )


def _pointer(text: str) -> str:
    """A JSON Pointer token (RFC 6901): ``tessera.dev/gpu`` -> ``tessera.dev~1gpu``."""
    return text.replace("~", "~0").replace("/", "~1")


def _defaulted_shares(container: Container, index: int) -> list[dict[str, Any]]:
    """JSONPatch operations giving ``container`` one share, when it has a slice and no count."""
    limits = container.resources.limits
    requests = container.resources.requests
    asked = {**(requests or {}), **(limits or {})}
    if names.GPU in asked or not any(r in asked for r in SLICE_RESOURCES):
        return []
    path = f"/spec/containers/{index}/resources"
    operations: list[dict[str, Any]] = []
    for section, present in (("limits", limits), ("requests", requests)):
        if present is None:
            if section == "limits":
                operations.append(
                    {"op": "add", "path": f"{path}/limits", "value": {names.GPU: "1"}}
                )
            continue
        operations.append(
            {"op": "add", "path": f"{path}/{section}/{_pointer(names.GPU)}", "value": "1"}
        )
    return operations


def _tessera_scheduled(pod: Pod, policy: AdmissionPolicy) -> bool:
    """Whether the pod is Tessera's to place (its own scheduler or an extender scheduler)."""
    scheduler = pod.spec.scheduler_name or DEFAULT_SCHEDULER
    return scheduler == policy.scheduler_name or scheduler in policy.extender_scheduler_names


def mutate(request: AdmissionRequest, policy: AdmissionPolicy) -> Review | BadReview:
    """The mutating review (see the module docstring)."""
    pod = _reviewed_pod(request)
    if pod is None or isinstance(pod, BadReview):
        return pod or _allowed(request)
    if pod.spec.node_name or not requests_tessera(pod):
        return _allowed(request)
    operations: list[dict[str, Any]] = []
    changes: list[str] = []
    scheduler = pod.spec.scheduler_name or DEFAULT_SCHEDULER
    if scheduler == DEFAULT_SCHEDULER and scheduler not in policy.extender_scheduler_names:
        operations.append(
            {"op": "add", "path": "/spec/schedulerName", "value": policy.scheduler_name}
        )
        changes.append(f"spec.schedulerName: {policy.scheduler_name}")
    if policy.default_gpu_shares and (_tessera_scheduled(pod, policy) or operations):
        for index, container in enumerate(pod.spec.containers):
            defaulted = _defaulted_shares(container, index)
            if defaulted:
                operations.extend(defaulted)
                changes.append(
                    f"spec.containers[{index}].resources.limits[{names.GPU}]: 1 "
                    f"(container {container.name!r})"
                )
    if not operations:
        return _allowed(request)
    patch = base64.b64encode(msgspec.json.encode(operations)).decode()
    response = AdmissionResponse(uid=request.uid, allowed=True, patch_type="JSONPatch", patch=patch)
    return Review(answer=ReviewAnswer(response=response), outcome="mutated", reasons=tuple(changes))


def validate(request: AdmissionRequest, policy: AdmissionPolicy) -> Review | BadReview:
    """The validating review (see the module docstring)."""
    pod = _reviewed_pod(request)
    if pod is None or isinstance(pod, BadReview):
        return pod or _allowed(request)
    if pod.spec.node_name or not _tessera_scheduled(pod, policy) or not requests_tessera(pod):
        return _allowed(request)
    # A pod of an extender scheduler is kube-scheduler's to place: constraints Tessera does not
    # implement are not Tessera's to refuse there.
    own = (pod.spec.scheduler_name or DEFAULT_SCHEDULER) == policy.scheduler_name
    parsed = parse_pending(pod, strict_constraints=own)
    if not isinstance(parsed, InvalidPod):
        return _allowed(request)
    response = AdmissionResponse(
        uid=request.uid,
        allowed=False,
        status=Status(code=422, reason="Invalid", message=parsed.reason),
    )
    return Review(
        answer=ReviewAnswer(response=response),
        outcome="denied",
        reasons=tuple(error.field for error in parsed.errors),
    )
