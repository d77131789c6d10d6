"""Pure: Tessera's admission webhook (docs/design.md §13) over AdmissionReview v1.

Two reviews of a pod being created, as the API server asks them (mutating first, then validating
the mutated pod):

- **mutate** (``/mutate``): a pod asking for ``tessera.dev/*`` resources whose scheduler is
  unset or ``default-scheduler`` (and not one of the extender schedulers the operator named) gets
  ``spec.schedulerName`` set to Tessera's; a container that gives a slice (memory, memory
  percentage or cores) without ``tessera.dev/gpu`` gets ``tessera.dev/gpu: 1`` in its limits
  (and requests), as HAMi defaults its GPU count, unless the operator turned that off. A pod
  with a claim of class ``gpu.tessera.dev`` (``claims.py``) whose scheduler is unset or
  ``default-scheduler`` gets Tessera's, extender or not. The answer is a JSONPatch.
- **validate** (``/validate``): a pod of Tessera's schedulers asking for Tessera resources is
  refused when Tessera could never place it as written, with exactly the one line the binder
  would write on it (``shared.podspec``: the same parse, the same reasons); and when no node of
  the cluster could ever hold its GPUs (``shared.capacity``, against each node's GPUs as the
  inventories publish them: ``capacity.py``), with the number: "asks 200000 MiB per GPU; the
  largest GPU here has 81920 MiB", "asks 9 GPUs; a node here has at most 4 GPUs"; and when
  ``kubectl apply`` sent its ``tessera.dev/gpu-memory`` in thousandths (``2000m``: the API server
  stores it as ``2``, but kubectl's last-applied annotation keeps the text). That includes a
  scheduling constraint Tessera's own scheduler does not implement (a field, operator or policy
  a later Kubernetes adds), named by its field: refused, never ignored. And a pod with a claim of
  class ``gpu.tessera.dev`` on any scheduler but Tessera's is refused: one allocator per device.

And on a pod's CREATE or UPDATE, whatever its scheduler: Tessera's own annotations
(``tessera.dev/assignment``, ``bind-time``, ``assigned``) are written by Tessera only. A review
that sets, changes or removes one is refused unless ``userInfo`` names the binder's identity
(``AdmissionPolicy.binder_usernames``): a placement restored after NATS lost its store is read
from ``tessera.dev/assignment``, so a pod's owner must not be able to point it at another GPU.

Pods already bound (``spec.nodeName``), pods of other schedulers, pods asking for no Tessera
resource and every other operation are otherwise allowed untouched. A body that is not an
AdmissionReview v1 is a :class:`BadReview` (the shell answers 400 with its reason), never an
exception.
"""

from __future__ import annotations

import base64
from collections.abc import Collection
from typing import Any, Final, Literal

import msgspec

from services.webhook.claims import (
    Lookup,
    knows_nothing,
    pod_claims,
    unknown_warnings,
    wrong_scheduler,
)
from shared import annotations as names
from shared.capacity import GpuAsk, Models, NodeGpus, never_fits
from shared.kubeobjects import Container, Pod
from shared.messages.pods import PodPending
from shared.podspec import (
    FieldError,
    InvalidPod,
    gpu_memory_problem,
    parse_pending,
    requests_tessera,
)

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"
DEFAULT_SCHEDULER: Final = "default-scheduler"
LAST_APPLIED: Final = "kubectl.kubernetes.io/last-applied-configuration"
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
    binder_usernames: tuple[str, ...] = ()
    """The users that may write Tessera's annotations (the binder's service account)."""


class GroupVersionResource(msgspec.Struct, frozen=True, kw_only=True):
    group: str = ""
    version: str = ""
    resource: str = ""


class UserInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Who asks, as the API server authenticated them."""

    username: str = ""
    groups: tuple[str, ...] = ()


class AdmissionRequest(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The part of ``AdmissionReview.request`` a review reads."""

    uid: str
    resource: GroupVersionResource = GroupVersionResource()
    sub_resource: str = ""
    namespace: str = ""
    operation: str = ""
    user_info: UserInfo = UserInfo()
    object: msgspec.Raw = msgspec.Raw()
    """The pod, kept undecoded until a review needs it (empty when absent)."""
    old_object: msgspec.Raw = msgspec.Raw()
    """The pod an UPDATE replaces (empty when absent)."""


class _Metadata(msgspec.Struct, frozen=True, kw_only=True):
    annotations: dict[str, str] | None = None


class _Annotated(msgspec.Struct, frozen=True, kw_only=True):
    """An object's annotations, whatever else it holds."""

    metadata: _Metadata = _Metadata()


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
    warnings: tuple[str, ...] = ()
    """Shown to the client (kubectl prints them)."""


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
    unknown: tuple[str, ...] = ()
    """The pod's claims the claim index did not know, when they decided the review (the shell
    may wait for the index and review again)."""


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


def _written(raw: msgspec.Raw) -> dict[str, str] | BadReview:
    """Tessera's own annotations on an object of a review (none when it is absent)."""
    if not raw or bytes(raw) == b"null":
        return {}
    try:
        annotations = msgspec.json.decode(raw, type=_Annotated).metadata.annotations or {}
    except (msgspec.ValidationError, msgspec.DecodeError) as error:
        return BadReview(reason=f"the pod of the review has no readable annotations: {error}")
    return {key: annotations[key] for key in names.WRITTEN if key in annotations}


def _annotations_refused(request: AdmissionRequest, policy: AdmissionPolicy) -> Review | BadReview:
    """A pod's CREATE or UPDATE that sets, changes or removes Tessera's own annotations, refused
    unless the binder asks (see the module docstring); allowed otherwise."""
    resource = request.resource
    if (
        request.operation not in ("CREATE", "UPDATE")
        or (resource.group, resource.resource) != ("", "pods")
        or request.sub_resource
    ):
        return _allowed(request)
    new = _written(request.object)
    old = _written(request.old_object) if request.operation == "UPDATE" else {}
    if isinstance(new, BadReview):
        return new
    if isinstance(old, BadReview):
        return old
    changed = [key for key in names.WRITTEN if new.get(key) != old.get(key)]
    user = request.user_info.username
    if not changed or user in policy.binder_usernames:
        return _allowed(request)
    fields = [f"metadata.annotations[{key}]" for key in changed]
    writers = ", ".join(policy.binder_usernames) or "none configured"
    message = (
        f"{', '.join(fields)}: written by Tessera only (its binder: {writers}); "
        f"user {user or '(unknown)'!r} may not set, change or remove "
        f"{'it' if len(changed) == 1 else 'them'}"
    )
    response = AdmissionResponse(
        uid=request.uid, allowed=False, status=Status(code=403, reason="Forbidden", message=message)
    )
    return Review(answer=ReviewAnswer(response=response), outcome="denied", reasons=tuple(fields))


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


def mutate(
    request: AdmissionRequest, policy: AdmissionPolicy, claims: Lookup = knows_nothing
) -> Review | BadReview:
    """The mutating review (see the module docstring); ``claims``: the device classes of the
    cluster's claims and templates (``claims.py``)."""
    pod = _reviewed_pod(request)
    if pod is None or isinstance(pod, BadReview):
        return pod or _allowed(request)
    if pod.spec.node_name:
        return _allowed(request)
    found = pod_claims(pod, claims, pod.metadata.namespace or request.namespace)
    if not requests_tessera(pod) and not found.tessera:
        if not found.unknown:
            return _allowed(request)
        warnings = unknown_warnings(found, policy.scheduler_name)
        response = AdmissionResponse(uid=request.uid, allowed=True, warnings=warnings)
        return Review(
            answer=ReviewAnswer(response=response),
            outcome="allowed",
            unknown=tuple(ref.describe() for ref in found.unknown),
        )
    operations: list[dict[str, Any]] = []
    changes: list[str] = []
    scheduler = pod.spec.scheduler_name or DEFAULT_SCHEDULER
    # A pod with Tessera claims is never kube-scheduler's, not even as an extender's: it would
    # allocate the claims' devices itself.
    if scheduler == DEFAULT_SCHEDULER and (
        found.tessera or scheduler not in policy.extender_scheduler_names
    ):
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


def _never_fits(pod: Pod, pending: PodPending, cluster: Collection[NodeGpus]) -> InvalidPod | None:
    """The pod as invalid when no node of ``cluster`` could ever hold its GPUs."""
    asks = [
        GpuAsk(
            container=c.name,
            shares=c.gpu_shares,
            memory_mib=c.gpu_memory_mib,
            memory_pct=c.gpu_memory_pct,
        )
        for c in pending.containers
    ]
    hints = pending.hints
    found = never_fits(
        asks, cluster, Models(wanted=hints.gpu_models, excluded=hints.gpu_models_excluded)
    )
    if found is None:
        return None
    field = "spec.containers"
    index = next((i for i, c in enumerate(pod.spec.containers) if c.name == found.container), -1)
    if index >= 0 and found.resource:
        field = (
            f"spec.containers[{index}].resources.limits[{found.resource}] "
            f"(container {found.container!r})"
        )
    elif hints.gpu_models or hints.gpu_models_excluded:
        hint = names.GPU_MODEL if hints.gpu_models else names.GPU_MODEL_EXCLUDE
        field = f"metadata.annotations[{hint}]"
    return InvalidPod(
        uid=pending.uid,
        namespace=pending.namespace,
        name=pending.name,
        errors=(FieldError(field=field, problem=found.problem),),
    )


class _AppliedResources(msgspec.Struct, frozen=True, kw_only=True):
    limits: dict[str, Any] | None = None
    requests: dict[str, Any] | None = None


class _AppliedContainer(msgspec.Struct, frozen=True, kw_only=True):
    name: str = ""
    resources: _AppliedResources = _AppliedResources()


class _AppliedSpec(msgspec.Struct, frozen=True, kw_only=True):
    containers: tuple[_AppliedContainer, ...] = ()


class _Applied(msgspec.Struct, frozen=True, kw_only=True):
    spec: _AppliedSpec = _AppliedSpec()


def _as_applied(pod: Pod) -> InvalidPod | None:
    """``tessera.dev/gpu-memory`` as ``kubectl apply`` sent it, when that is refused.

    The API server stores quantities in their canonical form before any webhook sees them
    (``2000m`` becomes ``2``): only the text kubectl keeps in its last-applied annotation still
    says the user wrote thousandths."""
    applied_text = (pod.metadata.annotations or {}).get(LAST_APPLIED)
    if not applied_text:
        return None
    try:
        applied = msgspec.json.decode(applied_text, type=_Applied)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None  # not ours to judge: the pod itself is what is placed
    errors = []
    for index, container in enumerate(applied.spec.containers):
        for section in ("limits", "requests"):
            value = (getattr(container.resources, section) or {}).get(names.GPU_MEMORY)
            problem = gpu_memory_problem(value) if value is not None else None
            if problem:
                errors.append(
                    FieldError(
                        field=f"spec.containers[{index}].resources.{section}[{names.GPU_MEMORY}] "
                        f"(container {container.name!r})",
                        problem=problem,
                    )
                )
                break
    meta = pod.metadata
    if not errors:
        return None
    return InvalidPod(uid=meta.uid, namespace=meta.namespace, name=meta.name, errors=tuple(errors))


def _denied(request: AdmissionRequest, message: str, fields: tuple[str, ...]) -> Review:
    response = AdmissionResponse(
        uid=request.uid,
        allowed=False,
        status=Status(code=422, reason="Invalid", message=message),
    )
    return Review(answer=ReviewAnswer(response=response), outcome="denied", reasons=fields)


def validate(
    request: AdmissionRequest,
    policy: AdmissionPolicy,
    cluster: Collection[NodeGpus] = (),
    claims: Lookup = knows_nothing,
) -> Review | BadReview:
    """The validating review (see the module docstring); ``cluster``: each node's GPUs (none
    known: nothing is judged against the cluster); ``claims``: the device classes of the
    cluster's claims and templates."""
    refused = _annotations_refused(request, policy)
    if isinstance(refused, BadReview) or refused.outcome == "denied":
        return refused
    pod = _reviewed_pod(request)
    if pod is None or isinstance(pod, BadReview):
        return pod or _allowed(request)
    if not pod.spec.node_name:
        found = pod_claims(pod, claims, pod.metadata.namespace or request.namespace)
        scheduler = pod.spec.scheduler_name or DEFAULT_SCHEDULER
        wrong = wrong_scheduler(scheduler, found, policy.scheduler_name)
        if wrong:
            return _denied(request, wrong, ("spec.schedulerName",))
    if pod.spec.node_name or not _tessera_scheduled(pod, policy) or not requests_tessera(pod):
        return _allowed(request)
    # A pod of an extender scheduler is kube-scheduler's to place: constraints Tessera does not
    # implement are not Tessera's to refuse there.
    own = (pod.spec.scheduler_name or DEFAULT_SCHEDULER) == policy.scheduler_name
    parsed = parse_pending(pod, strict_constraints=own)
    invalid = (
        parsed
        if isinstance(parsed, InvalidPod)
        else _as_applied(pod) or _never_fits(pod, parsed, cluster)
    )
    if invalid is None:
        return _allowed(request)
    return _denied(request, invalid.reason, tuple(error.field for error in invalid.errors))
